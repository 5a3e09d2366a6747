"""The engine's rank-0 logic without ranks: admission, batch composition, the step plan's wire
format, policies and the reference check."""

from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np
import pytest
import torch

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.source import weight_source
from splash_core.engine import reference_check
from splash_core.engine.admission import Admission, KVCapacity, plan_capacity
from splash_core.engine.controller import Controller
from splash_core.engine.memory_plan import deployment_memory
from splash_core.engine.plan import Command, StepPlan, exchange
from splash_core.engine.policy import FixedPolicy, SchedulerPolicy, ScriptedPolicy, make_policy
from splash_core.engine.requests import Request, State
from splash_core.engine.summary import RunSummary, render
from splash_core.layouts import LAYOUTS, Layout
from splash_core.profiles import load
from splash_core.profiles.workload import RequestSpec
from splash_core.runtime.reference_model import ReferenceModel
from splash_core.runtime.step_batch import StepRequest

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP


def _requests(lengths, outputs=3):
    return [Request(RequestSpec(i, n, outputs), np.arange(n, dtype=np.int64) % 256) for i, n in enumerate(lengths)]


# ---- admission --------------------------------------------------------------------------

def test_a_request_no_layout_holds_is_rejected_with_the_numbers_and_the_rest_admitted():
    cap = KVCapacity(pages=4, page_size=16, T=2, source="test")
    queue = collections.deque(_requests([20, 200, 30]))  # 200 + 3 tokens: 13 pages, CP needs 7 > 4
    running = []
    changed = Admission(cap, concurrency=8, layouts=LAYOUTS).admit(queue, running, DP, step=0)
    states = {r.id: r.state for r in changed}
    assert states == {0: State.PREFILLING, 1: State.REJECTED, 2: State.PREFILLING}
    reason = changed[1].reason
    assert "13 in TP" in reason and "7 in CP" in reason and "than the pool's 4 (16 tokens each)" in reason
    assert [r.owner for r in running] == [0, 1]  # the least projected KV gets the next request


def test_admission_waits_at_the_head_of_the_queue_when_the_current_layout_is_full():
    cap = KVCapacity(pages=4, page_size=16, T=2, source="test")
    queue = collections.deque(_requests([40, 40, 10]))  # 3 pages each in TP: only one fits
    running = []
    admission = Admission(cap, concurrency=8, layouts=(TP,))
    admission.admit(queue, running, TP, step=0)
    assert [r.id for r in running] == [0] and [r.id for r in queue] == [1, 2]  # FIFO: 2 waits behind 1


def test_an_idle_group_admits_what_only_another_layout_holds_and_the_controller_moves_there():
    cap = KVCapacity(pages=4, page_size=16, T=2, source="test")
    reqs = _requests([100])  # 7 pages: TP and DP/DOP (one owner) cannot hold it, CP (4 + 3) can
    ctrl = Controller(reqs, FixedPolicyPreferring(TP), cap, concurrency=4, prefill_chunk=16, layout=TP)
    plan = ctrl.plan(0, T=2, page_size=16)
    assert plan.layout is CP  # the policy stays in TP, which cannot hold it
    assert "cannot hold the running requests in TP" in ctrl.reason
    ctrl.record(plan, np.zeros(1, np.int64), 0.01, CP)
    assert [(s.src, s.dst, s.refused) for s in ctrl.switches] == [(TP, CP, "")]


class FixedPolicyPreferring(ScriptedPolicy):
    """Always picks ``layout`` first but lists every layout as a fallback."""

    def __init__(self, layout):
        super().__init__((layout,) + tuple(l for l in LAYOUTS if l is not layout), every=10 ** 9)

    @property
    def layouts(self):
        return self.script


def test_plan_capacity_is_the_budget_capped_at_what_the_workload_can_use():
    dep = load("deployment", "cpu-tiny")
    small = plan_capacity(dep, 2, [100, 50, 300])  # the two largest: 19 + 7 pages
    assert small.pages == 26 and "workload" in small.source
    assert plan_capacity(dep, 2, [100], pages=5).pages == 5
    with pytest.raises(ValueError, match="at least one page"):
        plan_capacity(dep, 2, [100], pages=0)
    big = plan_capacity(dep, 4096, [1 << 30] * 4096, layouts=[Layout.TP, Layout.DP])  # more than memory holds
    counted = deployment_memory(dep, (Layout.TP, Layout.DP))  # weights counted from their tensors
    assert big.pages == min(m.kv_pages() for m in counted.layouts) and "after the weights" in big.source
    assert big.pages < plan_capacity(dep, 4096, [1 << 30] * 4096, layouts=[Layout.TP]).pages  # DP holds all heads


# ---- the controller ---------------------------------------------------------------------

def test_rows_mix_prefill_chunks_and_decode_in_batch_order():
    cap = KVCapacity(pages=64, page_size=16, T=2, source="test")
    reqs = _requests([30, 5, 40, 3])
    ctrl = Controller(reqs, FixedPolicy(TP), cap, concurrency=8, prefill_chunk=8, layout=TP)
    plan = ctrl.plan(0, T=2, page_size=16)
    # owners by least projected KV: 0, 1, 1, 0; rank 0's 8 rows all go to request 0, so request 3
    # (nothing fed yet) waits; rank 1 splits its 8 rows 5 + 3
    assert [(r.id, r.owner, r.start, r.rows) for r in plan.requests] == [(0, 0, 0, 8), (1, 1, 0, 5), (2, 1, 0, 3)]
    tokens = np.concatenate([reqs[r.id].prompt[: r.rows] for r in plan.requests])
    assert np.array_equal(plan.tokens, tokens)
    ctrl.record(plan, np.array([100, 101, 102]), 0.01, TP)
    assert reqs[1].state is State.DECODING and reqs[1].generated == [101]
    assert reqs[0].state is State.PREFILLING and reqs[0].generated == []  # mid-prompt predictions are no output
    plan = ctrl.plan(1, T=2, page_size=16)
    assert [(r.id, r.start, r.rows) for r in plan.requests] == [(0, 8, 8), (1, 5, 1), (2, 3, 8)]  # decode rows do not spend the chunk
    assert plan.tokens[8] == 101  # the decoding request feeds back its last token


def test_a_started_prefill_keeps_a_row_when_its_owners_chunk_is_spent():
    """A request that holds KV must be in every step, so a switch moves its history."""
    cap = KVCapacity(pages=64, page_size=16, T=1, source="test")
    reqs = _requests([30, 30, 30])
    ctrl = Controller(reqs, FixedPolicy(TP), cap, concurrency=8, prefill_chunk=40, layout=TP)
    plan = ctrl.plan(0, T=1, page_size=16)
    ctrl.record(plan, np.zeros(len(plan.requests), np.int64), 0.01, TP)
    assert [r.fed for r in reqs] == [30, 10, 0]
    ctrl.chunk = 4
    plan = ctrl.plan(1, T=1, page_size=16)
    assert [(r.id, r.rows) for r in plan.requests] == [(0, 1), (1, 4)]  # request 2 holds nothing: it waits
    ctrl.record(plan, np.zeros(len(plan.requests), np.int64), 0.01, TP)
    reqs[2].fed = 2  # as if it had started: now its owner's chunk goes to request 1 first
    plan = ctrl.plan(2, T=1, page_size=16)
    assert [(r.id, r.rows) for r in plan.requests] == [(0, 1), (1, 4), (2, 1)]


def test_requests_finish_with_exactly_their_tokens_and_are_released_by_the_next_plan():
    cap = KVCapacity(pages=64, page_size=16, T=2, source="test")
    reqs = _requests([4, 4], outputs=2)
    ctrl = Controller(reqs, FixedPolicy(DP), cap, concurrency=8, prefill_chunk=8, layout=DP)
    for step in range(2):
        plan = ctrl.plan(step, T=2, page_size=16)
        ctrl.record(plan, np.full(len(plan.requests), 7 + step), 0.01, DP)
    assert all(r.state is State.FINISHED and r.generated == [7, 8] for r in reqs)
    stop = ctrl.plan(2, T=2, page_size=16)
    assert stop.command is Command.STOP and sorted(stop.releases) == [0, 1]


class _Holding(FixedPolicy):
    """TP, and the scheduler's 'hold admission' every step."""

    def decide(self, x, current, steps_since_switch, step):
        return dataclasses.replace(super().decide(x, current, steps_since_switch, step), hold=True)


@pytest.mark.parametrize("policy, admitted_at", [(FixedPolicy(TP), 2), (_Holding(TP), 5)])
def test_a_hold_decision_keeps_admission_closed_while_requests_run(policy, admitted_at):
    cap = KVCapacity(pages=4, page_size=16, T=2, source="test")
    r0, r1, r2 = (Request(RequestSpec(i, n, k), np.zeros(n, np.int64)) for i, n, k in ((0, 40, 2), (1, 5, 5), (2, 20, 3)))
    ctrl = Controller([r0, r1, r2], policy, cap, concurrency=8, prefill_chunk=64, layout=TP)
    for step in range(6):  # 3 + 1 pages run first; request 2 (2 pages) fits once request 0 ends after step 1
        plan = ctrl.plan(step, T=2, page_size=16)
        ctrl.record(plan, np.zeros(len(plan.requests), np.int64), 0.01, TP)
    assert (r0.finished_step, r1.finished_step) == (1, 4)
    assert r2.admitted_step == admitted_at  # held: only once the group is idle


# ---- the plan on the wire ---------------------------------------------------------------

class _Recorder:
    """Broadcast on 'rank 0' records what it sends; on 'rank 1' it replays into the buffers."""

    def __init__(self, sent=None):
        self.sent = [] if sent is None else list(sent)
        self.replay = sent is not None

    def broadcast(self, tensor, src):
        if self.replay:
            tensor.copy_(self.sent.pop(0))
        else:
            self.sent.append(tensor.clone())


def test_the_step_plan_round_trips_through_two_broadcasts():
    plan = StepPlan(Command.STEP, 5, DOP, (StepRequest(3, 0, 10, 2), StepRequest(1, 1, 0, 1)),
                    np.array([11, 12, 13]), releases=(7, 9))
    rank0 = _Recorder()
    got0, tokens0 = exchange(rank0, "cpu", plan)
    got1, tokens1 = exchange(_Recorder(rank0.sent), "cpu", None)
    assert len(rank0.sent) == 2
    assert (got1.command, got1.step, got1.layout, got1.requests, got1.releases) == \
           (plan.command, 5, DOP, plan.requests, (7, 9))
    assert tokens0.tolist() == tokens1.tolist() == [11, 12, 13]
    stop = StepPlan(Command.STOP, 6, TP)
    sender = _Recorder()
    exchange(sender, "cpu", stop)
    assert len(sender.sent) == 1  # nothing to send after the header
    assert exchange(_Recorder(sender.sent), "cpu", None)[0].command is Command.STOP


# ---- policies ---------------------------------------------------------------------------

def test_policy_specs():
    dep = load("deployment", "cpu-tiny")
    assert isinstance(make_policy("splash", dep), SchedulerPolicy)
    assert make_policy("dp-attention", dep) == FixedPolicy(DP)
    script = make_policy("script:TP,DOP,CP:3", dep)
    assert script.every == 3 and [script.decide(None, TP, 0, s).layout for s in (0, 3, 6, 9)] == [TP, DOP, CP, TP]
    for bad in ("XP", "script:", "script:TP:0"):
        with pytest.raises(ValueError):
            make_policy(bad, dep)


# ---- the reference check ----------------------------------------------------------------

def test_the_reference_check_accepts_the_references_own_tokens_and_names_a_wrong_one():
    dep = load("deployment", "cpu-tiny")
    ref = ReferenceModel(dep.model, weight_source(dep.model, dep.seed), "cpu", torch.float32, dep.layers)
    prompts = {0: np.arange(20) % 256, 1: (np.arange(7) * 5) % 256}
    gen = generate(ref.step, [Prompt(i, 0, tuple(int(t) for t in p)) for i, p in prompts.items()], T=1,
                   page_size=16, chunk=8, new_tokens=5, release=ref.release)
    good = reference_check.check(dep, prompts, gen.tokens)
    assert good.passed and good.exact and good.tokens == 10 and good.mismatches == 0
    wrong = {0: gen.tokens[0], 1: gen.tokens[1][:4] + [(gen.tokens[1][4] + 1) % 256]}  # the last token
    bad = reference_check.check(dep, prompts, wrong)
    assert not bad.passed and bad.decisive == 1 and "request 1, output 4" in bad.first_failure
    cheapest = reference_check.check(dep, prompts, gen.tokens, flop_budget=1.0)  # at least one request
    assert cheapest.passed and (cheapest.requests, cheapest.of, cheapest.tokens) == (1, 2, 5)
    assert "the 1 cheapest of 2 requests" in cheapest.line()


def test_a_check_that_compared_nothing_does_not_pass():
    nothing = reference_check.check(load("deployment", "cpu-tiny"), {}, {})
    assert not nothing.passed and nothing.requests == 0
    assert nothing.line() == "nothing to compare: no request finished with generated tokens"
    summary = RunSummary("cpu-tiny", "w", "splash", "reference", "cpu", "tiny-mla", 2, 3, "fp32", 8, "configured", 32,
                         requests=1, served=0, rejected=({"id": 0, "reason": "too long"},), prompt_tokens=0,
                         output_tokens=0, elapsed_s=0.0, steps=0, layout_steps={}, step_ms=(), switches=(),
                         decisions={}, check={**dataclasses.asdict(nothing), "line": nothing.line()})
    text = render(summary)
    assert "reference check: passed" not in text
    assert text.endswith("reference check: not done, nothing to compare: no request finished with generated tokens")


def test_the_kv_tolerance_is_the_formats_unit_roundoff():
    assert reference_check.kv_tolerance(torch.float32) == 0.0
    assert reference_check.kv_tolerance(torch.float8_e4m3fn) == 1 / 16
    assert reference_check.kv_tolerance(torch.bfloat16) == 1 / 256
    with pytest.raises(ValueError, match="floating-point"):
        reference_check.kv_tolerance(torch.int8)


def test_a_sampled_token_that_differs_is_decisive_only_outside_the_kept_set_below_float32():
    from splash_core.engine.draws import uniforms
    from splash_core.runtime.sampling import SamplingParams, choose_rows

    logits = torch.tensor([[4.0, 3.0, 2.0, -5.0, -6.0]] * 3)
    p = SamplingParams(temperature=1.0, top_k=3, seed=2)
    ref = choose_rows(logits, [p] * 3, uniforms([p] * 3, [7] * 3, range(3)))
    other = next(t for t in (0, 1, 2) if t != int(ref[1]))  # kept by top-k, but not the reference's draw
    engine = torch.tensor([int(ref[0]), other, 4])  # row 2: outside the top-3
    differ, decisive, _ = reference_check._sampled(logits, engine, p, 7, exact=False)
    assert differ.tolist() == [False, True, True] and decisive.tolist() == [False, False, True]
    _, decisive, _ = reference_check._sampled(logits, engine, p, 7, exact=True)
    assert decisive.tolist() == [False, True, True]


def test_a_deployment_planning_more_memory_than_the_device_has_is_refused_before_loading(monkeypatch):
    from types import SimpleNamespace

    from splash_core.engine import device_fit

    dep = load("deployment", "cpu-tiny")  # 16 GiB x 0.5 planned per rank
    ctx = SimpleNamespace(rank=0, device="cuda:0")
    monkeypatch.setattr(device_fit, "device_memory", lambda device: (1 << 30, 4 << 30))  # planted: a 4 GiB device
    assert re.search(r"plans 8.00 GiB per rank .*cuda:0 has 4.00 GiB", device_fit.device_memory_problem(ctx, dep))
    monkeypatch.setattr(device_fit, "device_memory", lambda device: (1 << 30, 80 << 30))
    assert device_fit.device_memory_problem(ctx, dep) is None  # fits
    monkeypatch.setattr(device_fit, "device_memory", lambda device: None)  # the CPU: nothing to check
    assert device_fit.device_memory_problem(ctx, dep) is None
