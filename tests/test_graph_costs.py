"""Captured decode graphs in the cost model: the re-capture a switch that moves weights needs
(Eq 7), graph memory in Eq 6's scratch term A, the simulator's lazy captures, and `splash
decide`'s explanation; nothing changes where graphs are off or the profile has no capture terms."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from splash_core.cli.main import main
from splash_core.layouts import LAYOUTS, Layout
from splash_core.planning.costmodel import BatchArrays, CostModel
from splash_core.planning.graph_costs import HeldGraphs, capture_costs_from_samples, moves_weights, weight_sharing
from splash_core.planning.manifest import plan_switch
from splash_core.planning.scheduler import Scheduler
from splash_core.planning.switch_time import switch_cost
from splash_core.profiles import load
from splash_core.profiles.graphs import GraphConfig
from splash_core.profiles.loader import load_file
from splash_core.profiles.schema import ProfileError
from splash_core.studies.simulator import simulate

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP
ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


@pytest.fixture(scope="module")
def deployment():
    """T = 2, 4 layers of DeepSeek-V3 on the measured H200 profile, which holds capture terms."""
    d = load("deployment", "h200-x2-deepseek-v3")
    assert d.hardware.captures_graphs and d.graphs.mode == "auto"
    return d


def without_captures(d):
    return dataclasses.replace(d, hardware=dataclasses.replace(d.hardware, graph_capture_ms_per_layer=None,
                                                               graph_pool_mib=None))


def graphs_off(d):
    return dataclasses.replace(d, graphs=GraphConfig(mode="off"))


def decode_batch(n=16, context=8192, T=2):
    return BatchArrays.of([context] * n, np.arange(n) % T)


def test_which_switches_move_weights():
    """T > 1: between the placements (TP/DOP sharded, DP/CP replicated); T = 1: into a sharded
    layout (the mover cuts a fresh full 'shard'), never into a replicated one."""
    for a in LAYOUTS:
        for b in LAYOUTS:
            assert moves_weights(a, b, 2) == (a is not b and a.placement is not b.placement)
            assert moves_weights(a, b, 1) == (a is not b and b in (TP, DOP))
    assert weight_sharing(TP, 2) == (TP, DOP) and weight_sharing(CP, 4) == (CP, DP)
    assert weight_sharing(TP, 1) == (TP,) and weight_sharing(DP, 1) == (CP, DP)


@pytest.mark.parametrize("src,dst,moves", [(TP, DP, True), (DOP, CP, True), (CP, TP, True),
                                           (TP, DOP, False), (DP, CP, False)])
def test_a_switch_that_moves_weights_costs_one_capture_more(deployment, src, dst, moves):
    x = decode_batch()
    with_graphs, bare = CostModel.from_deployment(deployment), CostModel.from_deployment(without_captures(deployment))
    manifest = plan_switch(src, dst, x.to_batch(), deployment.model, 2, deployment.page_size,
                           layers=range(deployment.layers))
    got = switch_cost(manifest, with_graphs, with_graphs.evaluate(x).step_time(dst), x)
    base = switch_cost(manifest, bare, bare.evaluate(x).step_time(dst), x)
    capture = deployment.layers * deployment.hardware.graph_capture_ms_per_layer.value * 1e-3
    assert got.recapture_s == pytest.approx(capture if moves else 0.0)
    assert got.exposed_s == pytest.approx(base.exposed_s + got.recapture_s)
    assert got.blocking_s == pytest.approx(base.blocking_s + got.recapture_s)
    assert got.transfer_exposed_s == pytest.approx(base.exposed_s) and base.recapture_s == 0.0
    # without the batch (callers of before) Eq 7 is the transfer alone
    assert switch_cost(manifest, with_graphs, with_graphs.evaluate(x).step_time(dst)).recapture_s == 0.0


def test_graphs_off_or_a_profile_without_capture_terms_charges_nothing(deployment):
    x = decode_batch()
    for d in (graphs_off(deployment), without_captures(deployment), load("deployment", "h200-x8-deepseek-v3.2")):
        cost = CostModel.from_deployment(d)
        assert cost.graph_costs is None
        manifest = plan_switch(TP, DP, x.to_batch(), d.model, d.T, d.page_size, layers=range(2))
        assert switch_cost(manifest, cost, cost.evaluate(x).step_time(DP), x).recapture_s == 0.0
    # off and no terms give the same Eq 6 and step times
    a, b = (CostModel.from_deployment(d).evaluate(x) for d in (graphs_off(deployment), without_captures(deployment)))
    np.testing.assert_array_equal(a.memory_bytes, b.memory_bytes)


def test_beyond_the_largest_bucket_nothing_is_captured_now(deployment):
    graphs = CostModel.from_deployment(deployment).graph_costs
    wide = decode_batch(n=2 * (graphs.buckets[-1] + 1))  # more requests per owner than the largest bucket
    assert graphs.bucket(wide) is None and graphs.recapture_s(TP, DP, wide) == 0.0
    assert graphs.held_buckets(wide) == len(graphs.buckets)  # the start-up captured them all


def test_eq6_scratch_grows_by_the_graph_pool(deployment):
    x = decode_batch(n=16)  # 8 requests per owner: buckets 1, 2, 4, 8 held
    with_graphs = CostModel.from_deployment(deployment).evaluate(x)
    bare = CostModel.from_deployment(without_captures(deployment)).evaluate(x)
    # one pool holds every layout's graphs of every bucket
    want = deployment.hardware.graph_pool_mib.value * MIB
    np.testing.assert_allclose(with_graphs.scratch_bytes - bare.scratch_bytes, want)
    np.testing.assert_allclose(with_graphs.memory_bytes - bare.memory_bytes, want)
    need = Scheduler(deployment).decide(x, TP).need_bytes - Scheduler(without_captures(deployment)).decide(x, TP).need_bytes
    np.testing.assert_allclose(need, want)
    # one rank of one request: a single bucket, the same pool
    one = BatchArrays.of([100], [0])
    graphs = CostModel.from_deployment(deployment).graph_costs
    assert graphs.held_buckets(one) == 1
    np.testing.assert_allclose(graphs.held_bytes(one), want)


def test_held_graphs_follow_the_runtime(deployment):
    """Start-up captures every bucket up to the concurrency's; a switch that keeps weights keeps
    them; one that moves them drops them, its own capture charged to the switch; each other bucket
    is captured once, when a decode step first needs it."""
    graphs = CostModel.from_deployment(deployment).graph_costs
    held = HeldGraphs.at_start(graphs, TP, concurrency=16)
    assert held.held == {(TP, b) for b in (1, 2, 4, 8, 16)}
    assert held.step(TP, decode_batch(16)) == 0.0
    held.switch(TP, DOP, decode_batch(16))
    assert held.step(TP, decode_batch(16)) == 0.0  # TP's graphs survive TP -> DOP
    assert held.step(DOP, decode_batch(16)) == pytest.approx(graphs.capture_s)  # DOP's own, lazily
    held.switch(DOP, DP, decode_batch(16))
    assert held.held == {(DP, 8)}
    assert held.step(DP, decode_batch(16)) == 0.0  # charged to the switch
    assert held.step(DP, decode_batch(4)) == pytest.approx(graphs.capture_s)  # bucket 2: captured now
    assert held.step(DP, decode_batch(4)) == 0.0
    prefill = BatchArrays.of([100, 100], [0, 1], query_rows=[50, 50])
    assert held.step(DP, prefill) == 0.0  # prefill runs eagerly
    assert (held.lazy, held.lazy_s) == (2, pytest.approx(2 * graphs.capture_s))


def test_simulated_switches_pay_recapture_only_with_capture_terms(deployment):
    workload = load("workload", "sweep-b16-128k")  # 16 long requests: decode leaves TP for DP
    splash = simulate(deployment, workload, policies=("SPLASH",)).result("SPLASH")
    graphs = CostModel.from_deployment(deployment).graph_costs
    assert splash.switches and any(moves_weights(e.src, e.dst, 2) for e in splash.switches)
    for e in splash.switches:
        assert e.recapture_s in (0.0, pytest.approx(graphs.capture_s))
        assert (e.recapture_s > 0) <= moves_weights(e.src, e.dst, 2)
    assert splash.lazy_capture_s == pytest.approx(splash.lazy_captures * graphs.capture_s)
    for d in (without_captures(deployment), graphs_off(deployment)):
        bare = simulate(d, workload, policies=("SPLASH",)).result("SPLASH")
        assert all(e.recapture_s == 0.0 for e in bare.switches) and bare.lazy_captures == 0
        # the same steps without the captures; with graphs off, decode pays the eager host time instead
        assert (bare.total_time_s < splash.total_time_s) is (d.graphs.mode != "off")


def test_decide_explains_the_recapture_term(deployment, capsys):
    args = ["decide", "--deployment", "h200-x2-deepseek-v3", "--requests", "64x128k", "--current", "TP"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "switch TP -> DP" in out
    assert "re-capture 21.645 ms" in out and "TP -> DP moves the weights" in out and "bucket 32" in out
    assert "decode graphs in Eq 6's A per rank (one pool for every layout and bucket): 132.0 MiB" in out
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cost = data["switch_cost"]
    assert cost["recapture_s"] == pytest.approx(4 * 5.4113e-3)
    assert cost["exposed_s"] == pytest.approx(cost["transfer_exposed_s"] + cost["recapture_s"])
    assert data["layouts"][0]["graph_gib"] == pytest.approx(132 * MIB / (1 << 30))
    # a switch that keeps the weights says so, and one with graphs off says why nothing is charged
    s = Scheduler(deployment)
    x = BatchArrays.of([131072] * 64, np.arange(64) % 2)
    d = s.decide(x, TP)
    kept = dataclasses.replace(d, layout=DOP)
    assert s.switch_cost(kept, x).recapture_s == 0.0
    assert "TP -> DOP keeps the weights" in s.explain_switch_cost(kept, s.switch_cost(kept, x), x)
    off = Scheduler(graphs_off(deployment))
    assert "decode graphs are off" in off.explain_switch_cost(d, off.switch_cost(d, x), x)


def test_defaults_come_from_the_measurements():
    """The H200 profile's capture time is what the committed decode-step run gives; the paper's
    and datasheet profiles hold no capture terms (their sweeps do not move)."""
    samples = json.loads((ROOT / "bench/results/h200/decode_step.json").read_text())["samples"]
    per_layer_s = capture_costs_from_samples(samples)
    h200 = load("hardware", "h200")
    assert h200.graph_capture_ms_per_layer.value == pytest.approx(per_layer_s * 1e3, rel=1e-4)
    assert h200.graph_capture_ms_per_layer.source == h200.graph_pool_mib.source == "measured"
    pools = json.loads((ROOT / "bench/results/h200/graph_memory.json").read_text())["samples"]
    assert h200.graph_pool_mib.value == pytest.approx(max(s["bytes"] for s in pools) / MIB)
    assert len({s["bytes"] for s in pools if s["layout"] == "TP"}) == 1  # the same at 10 and 61 layers
    for name in ("h200-paper", "b200", "dcu-bw1000", "cpu"):
        assert not load("hardware", name).captures_graphs
    with pytest.raises(ValueError, match="no graph samples"):
        capture_costs_from_samples([{"path": "eager", "capture_s": 1.0, "layers": 2}])


def test_graph_memory_without_capture_time_is_refused(tmp_path):
    text = (ROOT / "profiles/hardware/cpu.yaml").read_text()
    path = tmp_path / "cpu-graphs.yaml"
    path.write_text(text.replace("name: cpu\n", "name: cpu-graphs\n", 1)
                    + "\ngraph_pool_mib: {value: 1, source: assumed, ref: test}\n")
    with pytest.raises(ProfileError, match="graph_pool_mib: only with graph_capture_ms_per_layer"):
        load_file("hardware", path)


def test_precopy_choice_charges_the_recapture_to_every_way_of_switching(deployment):
    """The handoff lands the weights like the one-step switch: both pay the one capture."""
    from splash_core.planning.precopy_time import plan_transition

    x = decode_batch(n=16, context=32768)
    cost = CostModel.from_deployment(deployment)
    best, costs = plan_transition(x, TP, DP, cost, cost.evaluate(x), 4, 0.48, layers=range(deployment.layers))
    assert all(c.recapture_s == pytest.approx(cost.graph_costs.capture_s) for c in costs)
    assert "re-capturing decode graphs" in best.explain()
    _, kept = plan_transition(x, TP, DOP, cost, cost.evaluate(x), 4, 0.48, layers=range(deployment.layers))
    assert kept and all(c.recapture_s == 0.0 for c in kept)


def test_simulate_prints_the_recapture(capsys):
    assert main(["simulate", "--deployment", "h200-x2-deepseek-v3", "--workload", "sweep-b16-128k"]) == 0
    out = capsys.readouterr().out
    assert "ms of it re-capturing decode graphs" in out and "captured on first use after switches" in out
