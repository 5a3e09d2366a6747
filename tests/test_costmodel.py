"""The cost model: the vectorised loads equal table2_loads (Table 2), Eq 10's
arithmetic on round numbers, Eq 4, Eq 7, and monotonic properties."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from table2_loads import loads

from splash_core.layouts import LAYOUTS, Layout
from splash_core.planning.costmodel import (BatchArrays, CostModel, dop_exchange_bytes, eq4_volume, exposed_switch_time,
                                            rank_loads, switch_cost)
from splash_core.planning.manifest import plan_switch
from splash_core.planning.ownership import Batch, Request, footprint
from splash_core.profiles import load
from splash_core.profiles.projections import layer_weight_bytes

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP


def hardware(**values):
    """A hardware profile with round numbers (every value 'assumed')."""
    base = dict(memory_gib=80, matmul_tflops=100, weight_read_gbps=1000, kv_read_gbps=1000, all_gather_gbps=100,
                all_to_all_gbps=50, all_reduce_gbps=100, collective_latency_us=10, step_overhead_us=100)
    base.update(values)
    data = {"name": "round", "platform": "test", "device": "test"}
    data.update({k: {"value": v, "source": "assumed", "ref": "test"} for k, v in base.items()})
    return load("hardware", data)


@pytest.fixture(scope="module")
def dsv32():
    return load("model", "deepseek-v3.2")


def random_batch(rng, B, T, prefill):
    contexts = rng.integers(1, 20_000, B)
    rows = np.minimum(np.where(rng.random(B) < 0.5, rng.integers(1, 700, B), 1), contexts) if prefill else np.ones(B, int)
    ids = rng.permutation(10 * B + 1)[:B]
    owners = rng.integers(0, T, B)  # idle ranks included
    return Batch(tuple(Request(int(i), int(s), int(o), int(q)) for i, s, o, q in zip(ids, contexts, owners, rows)))


@pytest.mark.parametrize("T", [1, 2, 4, 8])
@pytest.mark.parametrize("prefill", [False, True])
def test_vectorised_loads_equal_table2_loads(dsv32, T, prefill):
    rng = np.random.default_rng(T + 10 * prefill)
    for B in (0, 1, 3, 37):
        batch = random_batch(rng, B, T, prefill)
        fast = rank_loads(BatchArrays.from_batch(batch), T, 64)
        for layout in LAYOUTS:
            ref, mine = loads(layout, batch, dsv32, T, 64), fast.of(layout)
            fp = footprint(layout, batch, dsv32, T, 64)
            np.testing.assert_allclose(mine["kv_tokens"], ref.kv_stored_tokens)
            np.testing.assert_allclose(mine["pairs"], ref.attention_pairs)
            np.testing.assert_allclose(mine["proj_rows"], ref.projection_rows)
            np.testing.assert_allclose(mine["reserved_pages"] * 64 * dsv32.kv_bytes_per_token, fp.kv + fp.indexer)
            if layout in (DP, DOP):
                np.testing.assert_allclose(mine["own_rows"], ref.query_rows)


def test_weights_memory_match_the_footprint(dsv32):
    cm = CostModel(dsv32, hardware(), 8, page_size=64)
    batch = Batch.balanced(16, 5000, 8)
    est = cm.evaluate(BatchArrays.from_batch(batch))
    for i, layout in enumerate(LAYOUTS):
        fp = footprint(layout, batch, dsv32, 8, 64)
        state = est.memory_bytes[i] - est.scratch_bytes[i]
        np.testing.assert_allclose(state, fp.total)


def test_eq10_by_hand_for_tp_decode():
    """Dense attention (as the reference runtime runs it): every stage of Eq 10 and the shared MLP."""
    model = load("model", "tiny-mla")
    cm = CostModel(model, hardware(), 2, page_size=16, compute_dtype="fp32", sparse=False)
    x = BatchArrays.of([100, 300], [0, 1])
    step = cm.evaluate(x).step_time(TP)
    m, d, n_layers, idx = model.mla, model.hidden_size, 3, model.indexer
    sharded = m.heads * (m.q_lora_rank * (m.qk_nope_head_dim + m.qk_rope_head_dim)
                         + m.kv_lora_rank * (m.qk_nope_head_dim + m.v_head_dim) + m.v_head_dim * d)
    # Q-A, KV-A and the indexer's key projection: every TP rank runs them on every row
    replicated = d * m.q_lora_rank + d * (m.kv_lora_rank + m.qk_rope_head_dim) + d * idx.head_dim
    proj = max(2 * (sharded / 2 + replicated) * 2 / 100e12, (sharded / 2 + replicated) * 4 / 1000e9)
    flops_pair = 2 * m.heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)  # no indexer scores when dense
    att = max(400 / 2 * flops_pair / 100e12, 400 * model.kv_bytes_per_token_layer / 1000e9)
    comm = 2 * d * 4 / 100e9  # the O reduction of both rows
    mlp = max(2 * 6 * d * model.intermediate_size / 2 / 100e12, 3 * d * model.intermediate_size * 4 / 2 / 1000e9)
    ffn = n_layers * (mlp + 2 * d * 4 / 100e9 + 10e-6)  # the tensor-parallel MLP and its all-reduce
    expected = 100e-6 + n_layers * (proj + att + 10e-6 + comm) + ffn  # η_TP = 0
    assert step.ffn_s == pytest.approx(ffn, rel=1e-12)
    assert step.total_s == pytest.approx(expected, rel=1e-12)
    assert step.latency_s == pytest.approx(n_layers * 10e-6)


def test_eq4_dop_exchange_volume():
    own = np.array([5, 0, 3, 8])
    to_owner, from_owner = dop_exchange_bytes(own, heads=16, width_to_owner=576, width_from_owner=512,
                                              elem_bytes=2, T=4)
    assert to_owner.sum() + from_owner.sum() == pytest.approx(eq4_volume(16, 16, 576, 512, 2, 4))
    assert eq4_volume(16, 16, 576, 512, 2, 4) == 0.75 * 16 * 16 * (576 + 512) * 2
    assert to_owner[1] == 0 and from_owner[3] == pytest.approx(8 * 4 * 512 * 2)  # 8 rows elsewhere, 4 heads


def test_eq7_exposed_switch_time():
    assert exposed_switch_time([3, 3, 3], [2, 2, 2]) == 3 + 1 + 1
    assert exposed_switch_time([3, 3, 3], [5, 5, 5]) == 3  # later layers hide behind computation
    assert exposed_switch_time([1, 4, 0.5], [2, 2, 2]) == 1 + 2 + 0
    assert exposed_switch_time([], []) == 0


def test_switch_cost_from_a_manifest(dsv32):
    cm = CostModel(dsv32, hardware(), 8, page_size=64)
    batch = Batch.balanced(16, 4096, 8)
    x = BatchArrays.from_batch(batch)
    discard = switch_cost(plan_switch(TP, DOP, batch, dsv32, 8, 64), cm, cm.step_time(DOP, x))
    assert discard.exposed_s == discard.blocking_s == 0  # two discards: nothing crosses the network
    gather = plan_switch(DOP, DP, batch, dsv32, 8, 64)  # weights all-gather only
    cost = switch_cost(gather, cm, cm.step_time(DP, x))
    per_layer = 7 / 8 * layer_weight_bytes(dsv32, dsv32.layer_kinds[0]) / 100e9 + 10e-6
    assert cost.transfer_s[0] == pytest.approx(per_layer)
    assert cost.blocking_s == pytest.approx(61 * per_layer)
    assert cost.exposed_s == pytest.approx(per_layer + 60 * max(0.0, per_layer - cost.compute_s[0]))


def test_times_grow_with_context_and_batch(dsv32):
    cm = CostModel(dsv32, hardware(), 8, page_size=64)
    for batch in (1, 16, 128):
        previous = None
        for context in (1024, 8192, 65536, 262144):
            t = cm.evaluate(BatchArrays.of([context] * batch, np.arange(batch) % 8)).total_s
            if previous is not None:
                assert (t >= previous).all()
            previous = t
    small = cm.evaluate(BatchArrays.of([8192] * 8, np.arange(8) % 8)).total_s
    large = cm.evaluate(BatchArrays.of([8192] * 64, np.arange(64) % 8)).total_s
    assert (large >= small).all()


def test_memory_orders_as_eq1(dsv32):
    cm = CostModel(dsv32, hardware(), 8, page_size=64)
    mem = cm.evaluate(BatchArrays.of([131072] * 16, np.arange(16) % 8)).memory_bytes.max(axis=1)
    by = dict(zip(LAYOUTS, mem))
    assert by[DOP] < by[DP] and by[DOP] < by[CP] < by[TP]  # DOP stores everything once


def test_tp_reads_every_history_so_long_contexts_favour_others():
    cm = CostModel(load("model", "deepseek-v3"), hardware(), 8, page_size=64)
    est = cm.evaluate(BatchArrays.of([262144] * 16, np.arange(16) % 8))
    tp, dp = est.step_time(TP), est.step_time(DP)
    assert tp.bounds["att"] == "memory" and dp.bounds["att"] == "compute"
    assert tp.att_s > 1.5 * dp.att_s


def test_overlap_hides_communication_and_one_rank_has_none(dsv32):
    x = BatchArrays.of([65536] * 16, np.arange(16) % 8)
    none = CostModel(dsv32, hardware(), 8, page_size=64, overlap={CP: 0.0}).evaluate(x)
    half = CostModel(dsv32, hardware(), 8, page_size=64, overlap={CP: 0.5}).evaluate(x)
    i = LAYOUTS.index(CP)
    assert half.exposed_comm_s[i] < none.exposed_comm_s[i] and half.comm_s[i] == none.comm_s[i]
    solo = CostModel(dsv32, hardware(), 1, page_size=64).evaluate(BatchArrays.of([65536] * 4, [0] * 4))
    assert (solo.comm_s == 0).all() and (solo.latency_s == 0).all()


def test_hybrid_model_costs_kda_layers():
    model = load("model", "glm-5.3-flash")
    cm = CostModel(model, hardware(), 8, page_size=64)
    est = cm.evaluate(BatchArrays.of([32768] * 16, np.arange(16) % 8))
    assert set(est.layer_s) == {k for k in model.layer_kinds}
    assert (est.total_s > 0).all()
    assert dataclasses.asdict(est.step_time(DOP))["layer_s"]


# ---- the calibrated host term (t0/δ of Eq 10 as a runtime pays them) ---------------------

def with_host(hw, overheads_us: dict, overlap: float = 0.0):
    """``hw`` with per-layout host overheads (µs) and η_h."""
    return hw.with_host_overheads(overheads_us, overlap, source="assumed", ref="test")


def test_host_term_by_hand_additive_and_overlapped():
    model = load("model", "tiny-mla")
    x = BatchArrays.of([100, 300], [0, 1])
    plain = CostModel(model, hardware(), 2, page_size=16, compute_dtype="fp32").evaluate(x)
    assert (plain.host_s == 0).all()
    h = {TP: 50.0, CP: 400.0, DP: 0.0, DOP: 5.0}
    for eta in (0.0, 0.5, 1.0):
        est = CostModel(model, with_host(hardware(), h, eta), 2, page_size=16, compute_dtype="fp32").evaluate(x)
        for i, layout in enumerate(LAYOUTS):
            device = plain.layer_s[model.layer_kinds[0]][i]
            host = max(0.0, h[layout] * 1e-6 - eta * device)
            assert est.layer_s[model.layer_kinds[0]][i] == pytest.approx(device + host, rel=1e-12)
            assert est.host_s[i] == pytest.approx(3 * host, rel=1e-12, abs=1e-18)
            assert est.total_s[i] == pytest.approx(plain.total_s[i] + 3 * host, rel=1e-12)
    # η_h = 1: a layer takes the longer of host and device time
    big = CostModel(model, with_host(hardware(), {l: 1e5 for l in LAYOUTS}, 1.0), 2, page_size=16,
                    compute_dtype="fp32").evaluate(x)
    np.testing.assert_allclose(big.total_s, 100e-6 + 3 * 0.1 + big.ffn_s)


def test_absent_host_term_is_eq10_as_printed(dsv32):
    """Paper and datasheet profiles carry no host term: every number is what it was."""
    paper = load("hardware", "h200-paper")
    assert not paper.layer_overhead_us and paper.host_overlap is None
    assert paper.without_host_overheads() == paper
    x = BatchArrays.of([65536] * 16, np.arange(16) % 8)
    est = CostModel(dsv32, paper, 8, page_size=64).evaluate(x)
    assert (est.host_s == 0).all()
    parts = est.proj_s + est.att_s + est.latency_s + est.exposed_comm_s + est.overhead_s + est.ffn_s
    np.testing.assert_allclose(est.total_s, parts, rtol=1e-12)


def test_equal_additive_overheads_shift_every_layout_alike(dsv32):
    x = BatchArrays.of([40000] * 16, np.arange(16) % 8)
    plain = CostModel(dsv32, hardware(), 8, page_size=64).evaluate(x)
    shifted = CostModel(dsv32, with_host(hardware(), {l: 250.0 for l in LAYOUTS}), 8, page_size=64).evaluate(x)
    np.testing.assert_allclose(shifted.total_s - plain.total_s, 61 * 250e-6)
    assert list(np.argsort(shifted.total_s)) == list(np.argsort(plain.total_s))
    # Eq 7's per-layer compute includes the host time (later transfers hide behind it)
    assert shifted.step_time(DP).layer_s[dsv32.layer_kinds[0]] == pytest.approx(
        plain.step_time(DP).layer_s[dsv32.layer_kinds[0]] + 250e-6)


@pytest.mark.parametrize("change,message", [
    (lambda d: d["layer_overhead_us"].update(XP={"value": 1, "source": "assumed", "ref": "t"}),
     "layer_overhead_us.XP: must be one of TP, CP, DP, DOP"),
    (lambda d: d["layer_overhead_us"]["CP"].update(value=-3.0), "layer_overhead_us.CP.value: must be >= 0"),
    (lambda d: d["layer_overhead_us"].pop("DOP"), "layer_overhead_us: give every layout or none (missing DOP)"),
    (lambda d: d["layer_overhead_us"]["TP"].update(source="measured"), "a measured number needs date, machine"),
    (lambda d: d["host_overlap"].update(value=1.5), "host_overlap.value: must be in [0, 1]"),
    (lambda d: d.pop("layer_overhead_us"), "host_overlap: only meaningful with layer_overhead_us"),
])
def test_host_term_is_validated_at_load(change, message):
    from splash_core.profiles import ProfileError

    q = {"source": "assumed", "ref": "t"}
    data = {"name": "x", "platform": "test", "device": "test",
            **{k: {"value": 1.0, **q} for k in ("memory_gib", "matmul_tflops", "weight_read_gbps", "kv_read_gbps",
                                                "all_gather_gbps", "all_to_all_gbps", "all_reduce_gbps",
                                                "collective_latency_us", "step_overhead_us")},
            "layer_overhead_us": {l: {"value": 10.0, **q} for l in ("TP", "CP", "DP", "DOP")},
            "host_overlap": {"value": 0.5, **q}}
    load("hardware", data)  # valid as given
    change(data)
    with pytest.raises(ProfileError, match=re.escape(message)):
        load("hardware", data)


def test_costmodel_check_fits_only_its_fit_points(tmp_path):
    """bench/costmodel_check.py on the committed H200 steps: the host term is fitted to the points
    at the fit context (and lowers their error), every other point is held out, and the summary
    is computed from the held-out points."""
    from bench_scripts import BENCH, load_bench

    from splash_core.results import read_result

    bench = load_bench("costmodel_check")
    measured = BENCH / "results" / "h200" / "runtime_step.json"
    assert bench.main(["--measured", str(measured), "--out", str(tmp_path)]) == 0
    summary = read_result(tmp_path / "h200" / "costmodel_check.json")["summary"]
    points = summary["points"]
    assert {p["context"] for p in points if p["role"] == "fit"} == {8192}
    assert {p["context"] for p in points if p["role"] == "check"} == {32768, 131072}

    def fit_error(variant: str) -> float:
        return np.mean([abs(p["error_pct"]) for p in points if p["variant"] == variant and p["role"] == "fit"])

    for v in summary["variants"]:
        if v["variant"] not in ("Eq 10 alone", bench.AS_CALIBRATED):  # the variants fitted here
            assert fit_error(v["variant"]) < fit_error("Eq 10 alone")
        held = [p for p in points if p["variant"] == v["variant"] and p["role"] == "check"]
        decode = [abs(p["error_pct"]) for p in held if p["phase"] == "decode"]
        assert v["decode_mean_abs_error_pct"] == pytest.approx(np.mean(decode))
        assert v["cases"] == len({(p["phase"], p["batch"], p["context"]) for p in held})
    by_layout = {(r["variant"], r["layout"], r["phase"]): r for r in summary["by_layout"]}
    assert len(by_layout) == len(summary["variants"]) * 4 * 2
    tp = [abs(p["error_pct"]) for p in points if (p["variant"], p["layout"], p["phase"], p["role"])
          == ("Eq 10 alone", "TP", "prefill", "check")]
    assert by_layout[("Eq 10 alone", "TP", "prefill")]["mean_abs_error_pct"] == pytest.approx(np.mean(tp))
    overheads = {(o["variant"], o["layout"]) for o in summary["overheads"]}
    assert len(overheads) == 4 * (len(summary["variants"]) - 1)  # every variant but Eq 10 alone
