"""Eq 7 extended to pre-copies (splash_core.planning.precopy_time): the cost of each way to switch, and
the scheduler's choice between them, on the 8-H200 DeepSeek-V3.2 deployment's cost model (θ
as profiled; the interference coefficient α is a placeholder, so the tests sweep it)."""

from __future__ import annotations

import pytest

from splash_core.layouts import Layout
from splash_core.planning.costmodel import BatchArrays, CostModel
from splash_core.planning.precopy_time import (ONE_STEP, PRECOPY, candidate_steps, interference_from_probe,
                                               plan_transition, precopy_cost)
from splash_core.planning.switch_time import SwitchCost
from splash_core.profiles import load

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP


@pytest.fixture(scope="module")
def decode_batch():
    deployment = load("deployment", "h200-x8-deepseek-v3.2")
    cost = CostModel.from_deployment(deployment)
    B, s = 16, 32768
    x = BatchArrays.of([s] * B, [i % deployment.T for i in range(B)], query_rows=[1] * B, ids=list(range(B)),
                       reserved=[s + 256] * B)
    return cost, x, cost.evaluate(x)


def test_precopy_cost_counts_what_outlasts_each_step_and_the_interference():
    handoff = SwitchCost(0.002, 0.004, (0.004,), (0.001,))
    # 30 ms of prefix over 3 steps of 8 ms: 2 ms a step outlasts it, 8 ms a step overlaps it
    c = precopy_cost(handoff, 0.030, 3, src_step_s=0.008, dst_step_s=0.007, interference=0.5)
    assert c.kind == PRECOPY and c.steps == 3 and c.exposed_s == 0.002
    assert c.background_s == pytest.approx(3 * (0.002 + 0.5 * 0.008))
    assert c.delay_s == pytest.approx(3 * 0.001)
    assert c.total_s == pytest.approx(0.002 + 0.018 + 0.003)
    # a destination slower than the source costs no delay; with α = 0 a copy that fits its step is free
    free = precopy_cost(handoff, 0.030, 6, src_step_s=0.008, dst_step_s=0.009, interference=0.0)
    assert (free.background_s, free.delay_s) == (0.0, 0.0)
    with pytest.raises(ValueError, match="at least one step"):
        precopy_cost(handoff, 0.030, 0, 0.008, 0.007, 0.5)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        precopy_cost(handoff, 0.030, 1, 0.008, 0.007, 1.5)


def test_candidate_steps():
    assert candidate_steps(1) == (1,)
    assert candidate_steps(4) == (1, 2, 4)
    assert candidate_steps(6) == (1, 2, 4, 6)


@pytest.mark.parametrize("src, dst", [(DP, TP), (CP, DP), (DP, CP)])
def test_a_handoff_exposes_only_the_dirty_tail(decode_batch, src, dst):
    """Decode at B = 16, 32K, where KV moves: every pre-copy's handoff exposes a small fraction of
    the one-step switch; with no interference the scheduler pre-copies, with full interference
    (every copied second slows a step by as much) the one-step switch, which hides some of it, wins."""
    cost, x, est = decode_batch
    best, costs = plan_transition(x, src, dst, cost, est, 8, 0.0)
    one = costs[0]
    assert one.kind == ONE_STEP and [c.steps for c in costs] == [0, 1, 2, 4, 8]
    assert all(c.exposed_s < 0.01 * one.exposed_s for c in costs[1:]), [c.explain() for c in costs]
    assert best.kind == PRECOPY and best.total_s < one.total_s, best.explain()
    worst, _ = plan_transition(x, src, dst, cost, est, 8, 1.0)
    assert worst.kind == ONE_STEP, worst.explain()
    assert "one-step switch" in worst.explain() and "pre-copy of" in best.explain()


def test_nothing_to_precopy_switches_in_one_step(decode_batch):
    """TP into DP only discards KV: a pre-copy has nothing to take off the handoff, so it only adds
    steps in the source layout, and the one-step switch wins for every α."""
    cost, x, est = decode_batch
    for alpha in (0.0, 0.25):
        best, costs = plan_transition(x, TP, DP, cost, est, 4, alpha)
        assert best.kind == ONE_STEP
        assert all(c.exposed_s == pytest.approx(costs[0].exposed_s) and c.background_s == 0.0 for c in costs[1:])


def test_interference_from_the_copy_probe():
    """The step's slowdown over the copies it overlapped (8 layers, each beside one layer's copies)."""
    rows = [{"variant": "kernels", "slowdown_ms": 4.0, "copy_alone_ms": 1.0},
            {"variant": "kernels", "slowdown_ms": 6.0, "copy_alone_ms": 1.0},
            {"variant": "memcpy", "slowdown_ms": 1.0, "copy_alone_ms": 1.0}]
    assert interference_from_probe(rows, 8) == pytest.approx(0.625)
    assert interference_from_probe(rows, 8, "memcpy") == pytest.approx(0.125)
    with pytest.raises(ValueError, match="no 'pull' rows"):
        interference_from_probe(rows, 8, "pull")
    assert load("deployment", "cpu-tiny").scheduler.precopy_interference == 0.48


def _decode(deployment, B, s, grown=0):
    return BatchArrays.of([s + grown] * B, [i % deployment.T for i in range(B)], query_rows=[1] * B,
                          ids=list(range(B)), reserved=[s + 256] * B)


def test_the_policy_keeps_its_precopy_choice_until_the_handoff(monkeypatch):
    """B = 16 decode at 32K in CP: the scheduler wants TP every step, by a pre-copy of k steps.
    The transition is planned once, at the first step; the k steps beside the pre-copy and its
    handoff keep that choice; a later step (the handoff did not happen), a new source or a new
    destination plan again."""
    import dataclasses

    from splash_core.engine import policy as policies

    deployment = load("deployment", "h200-x8-deepseek-v3.2")
    planned = []
    real = policies.plan_transition
    monkeypatch.setattr(policies, "plan_transition", lambda x, src, dst, *a, **kw: planned.append((src, dst)) or
                        real(x, src, dst, *a, **kw))
    policy = policies.SchedulerPolicy(deployment, 8)
    first = policy.decide(_decode(deployment, 16, 32768), CP, float("inf"), 10)
    k = first.precopy_steps
    assert first.layout is TP and k >= 1 and planned == [(CP, TP)], first.reason
    for step in range(11, 11 + k):
        again = policy.decide(_decode(deployment, 16, 32768, step - 10), CP, float("inf"), step)
        assert again.layout is TP and again.precopy_steps == k
        assert again.reason.endswith("; " + first.reason.rsplit("; ", 1)[1] + " (chosen at step 10)"), again.reason
    assert planned == [(CP, TP)]
    policy.decide(_decode(deployment, 16, 32768, k + 1), CP, float("inf"), 11 + k)
    assert planned == [(CP, TP)] * 2
    # the scheduler names another destination mid-pre-copy: planned afresh for it
    decide = policy.scheduler.decide
    monkeypatch.setattr(policy.scheduler, "decide", lambda *a: dataclasses.replace(decide(*a), layout=DOP))
    policy.decide(_decode(deployment, 16, 32768, k + 2), CP, float("inf"), 12 + k)
    assert planned == [(CP, TP)] * 2 + [(CP, DOP)]
    # a one-step choice is not kept: nothing runs beside it
    monkeypatch.setattr(policy.scheduler, "decide", decide)
    one = policies.SchedulerPolicy(dataclasses.replace(deployment, scheduler=dataclasses.replace(
        deployment.scheduler, precopy_interference=1.0)), 8)
    planned.clear()
    for step in range(3):
        assert one.decide(_decode(deployment, 16, 32768, step), CP, float("inf"), step).precopy_steps == 0
    assert planned == [(CP, TP)] * 3
