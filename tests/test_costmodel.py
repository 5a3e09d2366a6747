"""The cost model: the vectorised loads equal splash_core.loads (Table 2), Eq 10's
arithmetic on round numbers, Eq 4, Eq 7, and monotonic properties."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from splash_core.costmodel import (BatchArrays, CostModel, dop_exchange_bytes, eq4_volume, exposed_switch_time,
                                   rank_loads, switch_cost)
from splash_core import weights
from splash_core.layouts import LAYOUTS, Layout
from splash_core.loads import loads
from splash_core.manifest import plan_switch
from splash_core.ownership import Batch, Request, footprint
from splash_core.profiles import load

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
    model = load("model", "tiny-mla")
    cm = CostModel(model, hardware(), 2, page_size=16, compute_dtype="fp32")
    x = BatchArrays.of([100, 300], [0, 1])
    step = cm.evaluate(x).step_time(TP)
    m, d, n_layers = model.mla, model.hidden_size, 3
    sharded = m.heads * (m.q_lora_rank * (m.qk_nope_head_dim + m.qk_rope_head_dim)
                         + m.kv_lora_rank * (m.qk_nope_head_dim + m.v_head_dim) + m.v_head_dim * d)
    replicated = d * m.q_lora_rank + d * (m.kv_lora_rank + m.qk_rope_head_dim)
    proj = max(2 * (sharded / 2 + replicated) * 2 / 100e12, (sharded / 2 + replicated) * 4 / 1000e9)
    kv_bytes = model.kv_bytes_per_token_layer + model.indexer_bytes_per_token_layer
    flops_pair = 2 * m.heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) + 2 * model.indexer.heads * model.indexer.head_dim
    att = max(400 / 2 * flops_pair / 100e12, 400 * kv_bytes / 1000e9)
    comm = 2 * d * 4 / 100e9  # the O reduction of both rows
    expected = 100e-6 + n_layers * (proj + att + 10e-6 + comm)  # η_TP = 0
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
    per_layer = 7 / 8 * weights.layer_weight_bytes(dsv32, dsv32.layer_kinds[0]) / 100e9 + 10e-6
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
