"""The scheduler π(x; θ): argmin over the feasible set, the switching margin (no flapping
near a crossover), min steps between switches, forced switches, hold admission, and Eq 5
refusing a switch into TP that would overflow (paper §5.5)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from splash_core.cli.main import main
from splash_core.layouts import LAYOUTS, Layout
from splash_core.planning.costmodel import BatchArrays
from splash_core.planning.manifest import plan_switch
from splash_core.planning.scheduler import FORCED, HOLD, STAY, SWITCH, Scheduler
from splash_core.profiles import load

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP
GIB = float(1 << 30)


def deployment(margin=0.05, min_steps=0, memory_gib=None, model="deepseek-v3.2"):
    """The H200 deployment with only attention state in memory (M_0 = 0), so the memory
    numbers below are about SPLASH's own state, on the paper's H200 profile (its crossovers are
    the paper's; the measured profile's move with every calibration)."""
    dep = load("deployment", "h200-x8-deepseek-v3.2")
    hw = load("hardware", "h200-paper")
    if memory_gib is not None:
        hw = dataclasses.replace(hw, memory_gib=dataclasses.replace(hw.memory_gib, value=memory_gib))
    sched = dataclasses.replace(dep.scheduler, margin=margin, min_steps_between_switches=min_steps)
    return dataclasses.replace(dep, hardware=hw, scheduler=sched, model=load("model", model), memory_fraction=1.0,
                               common_gib=0.0)


def batch(contexts, T=8, reserved=None):
    return BatchArrays.of(contexts, np.arange(len(contexts)) % T, reserved=reserved)


def crossover(scheduler, B):
    """The context where the fastest layout for B requests first changes, and the two layouts."""
    def fastest(context):
        return LAYOUTS[int(np.argmin(scheduler.cost.evaluate(batch([int(context)] * B)).total_s))]

    grid = np.geomspace(1024, 1 << 20, 100).astype(int)
    for lo, hi in zip(grid[:-1], grid[1:]):
        below, above = fastest(lo), fastest(hi)
        if below is not above:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fastest(mid) is below else (lo, mid)
            return int(hi), below, above
    raise AssertionError("no crossover found")


def test_margin_prevents_flapping_near_a_crossover():
    flappy, steady = Scheduler(deployment(margin=0.0)), Scheduler(deployment(margin=0.05))
    context, below, above = crossover(steady, 16)
    # the load hovers around the crossover, 2% either way
    contexts = [int(context * f) for f in (0.98, 1.02) * 20]
    for s in (flappy, steady):
        s.current = below
    flaps = sum(flappy.step(batch([c] * 16)).switch for c in contexts)
    steps = [steady.step(batch([c] * 16)) for c in contexts]
    assert flaps >= 10  # without a margin every crossing switches
    assert sum(d.switch for d in steps) <= 1
    assert any("under the 5% margin" in d.reason or "fastest feasible" in d.reason for d in steps)


def test_min_steps_between_switches():
    s = Scheduler(deployment(margin=0.0, min_steps=3))
    context, below, above = crossover(s, 16)
    lo, hi = batch([int(context * 0.8)] * 16), batch([int(context * 1.25)] * 16)
    s.current = below
    assert s.step(hi).switch
    held = [s.step(lo) for _ in range(3)]
    assert not any(d.switch for d in held) and "minimum 3" in held[0].reason
    assert s.step(lo).switch  # the fourth step may switch back


def test_argmin_and_explanation():
    s = Scheduler(deployment())
    decision = s.decide(batch([160000] * 16), TP)  # TP reads every history on every rank
    assert decision.action == SWITCH
    feasible = [l for l in LAYOUTS if decision.fits_steady(l)]
    assert decision.layout == min(feasible, key=decision.time_s)
    rows = decision.as_dict()["layouts"]
    assert [r["layout"] for r in rows] == list(LAYOUTS) and all(r["time_s"] > 0 and r["need_gib"] > 0 for r in rows)
    assert f"switch TP -> {decision.layout}" in decision.reason and "margin 5%" in decision.reason
    assert str(decision.layout) in decision.explain()


def test_infeasible_current_layout_forces_a_switch():
    s = Scheduler(deployment(memory_gib=80))
    # small live contexts, but each request reserves 150k more tokens: TP cannot hold them all
    x = batch([2048] * 16, reserved=[2048 + 150_000] * 16)
    decision = s.decide(x, TP, steps_since_switch=0)  # forced even right after a switch
    assert not decision.fits_steady(TP)
    assert decision.action == FORCED and decision.layout is not TP and decision.fits_steady(decision.layout)
    assert decision.switch_checks[decision.layout].fits
    assert "no longer fits" in decision.reason


def test_no_feasible_layout_holds_admission_with_the_reason():
    s = Scheduler(deployment(memory_gib=40))
    decision = s.decide(batch([1 << 20] * 64), DOP)
    assert decision.action == HOLD and decision.layout is DOP and not decision.switch
    assert "no layout fits" in decision.reason and "GiB" in decision.reason


def test_eq5_refuses_a_switch_into_tp_that_would_overflow():
    """TP fits in steady state (Eq 6) and is fastest, but one layer of its KV all-gather on top
    of max(M_DOP, M_TP) exceeds memory (Eq 5): the scheduler stays, as SPLASH does in §5.5."""
    x = batch([40_000, 40_000])
    roomy = Scheduler(deployment(memory_gib=1000))
    est = roomy.cost.evaluate(x)
    assert LAYOUTS[int(np.argmin(est.total_s))] is TP
    need_tp = roomy.decide(x, DOP).need_bytes[LAYOUTS.index(TP)]
    dep = roomy.deployment
    manifest = plan_switch(DOP, TP, x.to_batch(), dep.model, 8, dep.page_size)
    scratch = est.scratch_bytes[[LAYOUTS.index(DOP), LAYOUTS.index(TP)]].max()
    peak = manifest.peak.max() + dep.reserve_bytes + dep.common_bytes + scratch
    assert need_tp < peak
    tight = Scheduler(deployment(memory_gib=(need_tp + peak) / 2 / GIB))
    decision = tight.decide(x, DOP)
    assert decision.fits_steady(TP) and decision.fits_steady(DOP)
    check = decision.switch_checks[TP]
    assert not check.fits and check.how == "planned" and check.peak_bytes == pytest.approx(peak)
    assert decision.action == STAY and decision.layout is DOP and "Eq 5" in decision.reason
    assert roomy.decide(x, DOP).action == SWITCH  # with room, the same switch is taken


def test_decide_cli(capsys):
    assert main(["decide", "--deployment", "h200-x8-deepseek-v3.2", "--requests", "4x8k,2x100k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["layouts"]) == 4 and out["requests"] == 6 and out["total_context"] == 4 * 8192 + 2 * 102400
    assert "not measured" in out["note"]
    assert main(["decide", "--deployment", "h200-x8-deepseek-v3.2", "--requests", "16x128k", "--current", "DP"]) == 0
    assert "decision:" in capsys.readouterr().out
    for bad in (["--requests", "16by128k"], ["--requests", "4x8q"], ["--requests", "4x8k", "--current", "XP"]):
        assert main(["decide", "--deployment", "h200-x8-deepseek-v3.2", *bad]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_decide_phase_cli(capsys):
    """--phase sets every request's query rows (prefill: a chunk), or the first group's (mixed)."""
    run = ["decide", "--deployment", "h200-x8-deepseek-v3.2", "--json"]
    assert main([*run, "--requests", "16x32k", "--phase", "prefill"]) == 0
    prefill = json.loads(capsys.readouterr().out)
    assert prefill["phase"] == "prefill" and prefill["query_rows"] == 16 * 8192
    assert main([*run, "--requests", "2x32k,14x8k", "--phase", "mixed", "--query-rows", "4096"]) == 0
    mixed = json.loads(capsys.readouterr().out)
    assert mixed["phase"] == "mixed" and mixed["query_rows"] == 2 * 4096 + 14
    assert main([*run, "--requests", "16x32k", "--phase", "decode"]) == 0
    decode = json.loads(capsys.readouterr().out)
    assert decode["query_rows"] == 16
    slower = {r["layout"]: r["time_s"] for r in prefill["layouts"]}
    assert all(slower[r["layout"]] > r["time_s"] for r in decode["layouts"])  # a chunk costs more than a row
    assert all(r["ffn_s"] > 0 for r in decode["layouts"])  # the shared dense/MoE blocks are charged
    assert main(["decide", "--deployment", "h200-x8-deepseek-v3.2", "--requests", "16x32k", "--phase", "mixed"]) == 2
    assert "two request groups" in capsys.readouterr().err
    assert main(["decide", "--deployment", "h200-x8-deepseek-v3.2", "--requests", "16x32k", "--phase", "prefill"]) == 0
    assert "prefill step of 131,072 query rows" in capsys.readouterr().out


def with_host(dep, overheads_us: dict, overlap: float):
    hw = dep.hardware.with_host_overheads(overheads_us, overlap, source="assumed", ref="test")
    return dataclasses.replace(dep, hardware=hw)


def test_ranking_follows_calibrated_host_overheads():
    """At 16 x 64K on 8 H200s Eq 10 alone picks one layout (``best``) with a runner-up close
    behind. A calibrated overhead per layer on ``best`` moves the choice exactly when it
    outweighs that lead (61 layers, host time added: η_h = 0), and a host-bound runtime (η_h = 1,
    ``best``'s host time above every layout's device time, as measured on the H200 pair) keeps
    the scheduler out of ``best``."""
    x = batch([65536] * 16)
    plain = Scheduler(deployment(margin=0.0))
    est = plain.cost.evaluate(x)
    t = dict(zip(LAYOUTS, est.total_s))
    best = min(LAYOUTS, key=t.get)
    start = next(l for l in LAYOUTS if l is not best)
    assert plain.decide(x, start).layout is best
    runner_up = min((l for l in LAYOUTS if l is not best), key=t.get)
    threshold_us = (t[runner_up] - t[best]) / 61 * 1e6  # extra host time per layer on best that ties
    for factor, expected in ((0.5, best), (2.0, runner_up)):
        overheads = {l: 100.0 + (factor * threshold_us if l is best else 0.0) for l in LAYOUTS}
        s = Scheduler(with_host(deployment(margin=0.0), overheads, 0.0))
        assert s.decide(x, start).layout is expected, factor
    lightest = next(l for l in LAYOUTS if l is not best)
    host_bound = {l: 4400.0 if l is best else 2450.0 if l is lightest else 2900.0 for l in LAYOUTS}
    s = Scheduler(with_host(deployment(), host_bound, 1.0))
    decision = s.decide(x, best)
    assert decision.action == SWITCH and decision.layout is not best
    # host-bound: h per layer, then the shared dense/MoE blocks
    assert decision.time_s(best) == pytest.approx(est.overhead_s + 61 * 4400e-6 + est.ffn_s)
    assert s.decide(x, lightest).layout is lightest  # the fastest stays
    rows = {r["layout"]: r for r in decision.layout_rows()}
    assert rows[best]["host_s"] > rows[lightest]["host_s"] > 0


def test_one_rank_never_switches():
    """At T = 1 every layout holds the same weights and KV and computes the same step: host
    overheads calibrated on a larger group make one layout look faster, and the scheduler stays
    (a switch would only cost a new set of decode graphs); at T = 8 the same overheads switch."""
    host = {TP: 2000.0, CP: 1800.0, DP: 1000.0, DOP: 1700.0}
    one = Scheduler(with_host(dataclasses.replace(deployment(), T=1), host, 0.0))
    x = batch([2048] * 64, T=1)
    est = one.cost.evaluate(x)
    assert est.total_s[LAYOUTS.index(DP)] < 0.9 * est.total_s[LAYOUTS.index(TP)]  # DP leads by over the margin
    decision = one.decide(x, TP)
    assert decision.action == STAY and decision.layout is TP and "one rank" in decision.reason
    eight = Scheduler(with_host(deployment(), host, 0.0))
    assert eight.decide(batch([2048] * 64), TP).action == SWITCH
