"""No crash under KV pressure (issue 36 §2): with a pool of 4 pages per layer and rank, at every
pair of (layout the group is in, layout the policy wants), on T = 2 gloo ranks, every request
either finishes with exactly the tokens of a run without pressure or is rejected with a reason
naming the pool; and a switch refused while the current layout cannot hold the running
requests ends them with the reason instead of running a step out of pages."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from splash_core.engine import Job, serve
from splash_core.engine.admission import KVCapacity
from splash_core.engine.controller import Controller
from splash_core.engine.plan import Command
from splash_core.engine.policy import Choice, FixedPolicy
from splash_core.engine.requests import GenerationRequest, Request, State
from splash_core.layouts import LAYOUTS, Layout
from splash_core.profiles.workload import RequestSpec

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP
PAGES = 4  # of 16 tokens per layer and rank
_rng = np.random.default_rng(36)
PROMPTS = (
    GenerationRequest(tuple(int(t) for t in _rng.integers(0, 256, 100)), 10),  # 7 pages: only CP (4 + 3) holds it
    GenerationRequest(tuple(int(t) for t in _rng.integers(0, 256, 20)), 6),  # 2 pages: every layout holds it
    GenerationRequest(tuple(int(t) for t in _rng.integers(0, 256, 300)), 4),  # 19 pages: no layout holds it
)


@dataclasses.dataclass(frozen=True)
class Wants:
    """Starts in ``initial`` and asks for ``wanted`` at every step, every other layout a fallback."""

    initial: Layout
    wanted: Layout

    @property
    def name(self) -> str:
        return f"{self.initial}->{self.wanted}"

    @property
    def layouts(self) -> tuple[Layout, ...]:
        return LAYOUTS

    def decide(self, x, current, steps_since_switch, step) -> Choice:
        rest = tuple(layout for layout in LAYOUTS if layout is not self.wanted)
        return Choice(self.wanted, "scripted", f"wants {self.wanted}", (self.wanted,) + rest)


@pytest.fixture(scope="module")
def unpressured(rank_pools):
    """The prompts' tokens without pressure (the pool sized for them, one layout), checked
    against the single-device reference."""
    summary = rank_pools(2).run(serve, Job("cpu-tiny", prompts=PROMPTS, policy=FixedPolicy(TP)))[0]
    assert summary.check["passed"] and summary.served == len(PROMPTS), summary.check
    return {o["id"]: o["token_ids"] for o in summary.outputs}


PAIRS = tuple((initial, wanted, "splash") for initial, wanted in itertools.product(LAYOUTS, LAYOUTS))
# pre-copies too: every switch forced into one (a first step, with no history yet, switches at once)
PRECOPY_PAIRS = ((TP, TP, "precopy"), (TP, DP, "precopy"), (DOP, CP, "precopy"))


def test_every_layout_pair_under_a_tiny_pool_finishes_or_rejects_with_the_limit(rank_pools, unpressured):
    pool = rank_pools(2)
    for initial, wanted, mode in PAIRS + PRECOPY_PAIRS:
        job = Job("cpu-tiny", prompts=PROMPTS, policy=Wants(initial, wanted), kv_pages=PAGES, check=False,
                  switch_mode=mode, precopy_steps=2)
        summary = pool.run(serve, job)[0]
        pair = f"{initial} wanting {wanted} ({mode})"
        outputs = {o["id"]: o for o in summary.outputs}
        assert summary.served == 2 and [r["id"] for r in summary.rejected] == [2], (pair, summary.rejected)
        assert "than the pool's 4 (16 tokens each)" in summary.rejected[0]["reason"], pair
        for rid in (0, 1):
            assert outputs[rid]["finish_reason"] == "length", (pair, outputs[rid])
            assert outputs[rid]["token_ids"] == unpressured[rid], (pair, rid)
        assert set(summary.layout_steps) <= {str(initial), str(wanted), "CP"}, (pair, summary.layout_steps)


def test_a_switch_that_eq5_refuses_ends_the_request_it_strands_and_the_group_serves_on(rank_pools):
    """A memory budget so small that Eq 5 refuses the switch from TP to CP (the only layout that
    holds request 0): the step runs in TP within its pool, request 0 ends with the refusal and
    the limit, request 1 finishes, request 2 is refused up front; nothing crashes."""
    starved = {"kind": "deployment", "name": "cpu-tiny-starved", "backend": "reference", "hardware": "cpu",
               "model": "tiny-mla", "T": 2, "page_size": 16, "reserve_gib": 0,
               "memory_fraction": 3.2e-5}  # ~537 KiB per rank: the weights and a page fit, a switch's peak does not
    job = Job(starved, prompts=PROMPTS, policy=Wants(TP, TP), kv_pages=PAGES, check=False)
    summary = rank_pools(2).run(serve, job)[0]
    reasons = {r["id"]: r["reason"] for r in summary.rejected}
    assert summary.served == 1 and sorted(reasons) == [0, 2], reasons
    assert reasons[0].startswith("100 prompt + 10 output tokens fit the KV pool (4 pages of 16 tokens per layer and "
                                 "rank) only in CP, not in TP, and the switch to CP was refused: "), reasons[0]
    assert "Eq 5" in reasons[0] and [(s.src, s.dst) for s in summary.switches if s.refused] == [("TP", "CP")]
    assert {o["id"]: len(o["token_ids"]) for o in summary.outputs}[1] == 6


def test_the_step_that_leaves_a_layout_too_small_feeds_only_what_that_layout_holds():
    """Idle in TP, a request only CP holds is admitted; the step that moves to CP feeds 64 of its
    100 prompt tokens (4 pages: what TP holds), so a refused switch leaves it within TP's pool."""
    cap = KVCapacity(pages=PAGES, page_size=16, T=2, source="test")
    ctrl = _controller(cap, [100])
    plan = ctrl.plan(0, T=2, page_size=16)
    assert plan.command is Command.STEP and plan.layout is CP
    assert [q.rows for q in plan.requests] == [64]
    r = ctrl.requests[0]
    assert cap.need([r], lengths=[64])[LAYOUTS.index(TP)] == PAGES < cap.need([r], lengths=[65])[LAYOUTS.index(TP)]
    # once in CP it feeds the rest of its prompt
    ctrl.record(plan, np.zeros(1, np.int64), 0.01, CP)
    assert [q.rows for q in ctrl.plan(1, T=2, page_size=16).requests] == [36]


def test_a_refused_switch_away_from_a_layout_too_small_rejects_with_the_refusal_and_frees_the_pages():
    cap = KVCapacity(pages=PAGES, page_size=16, T=2, source="test")
    ctrl = _controller(cap, [100, 20])
    plan = ctrl.plan(0, T=2, page_size=16)
    assert plan.layout is CP and [q.id for q in plan.requests] == [0]  # 1 waits: TP cannot hold both
    ctrl.record(plan, np.zeros(1, np.int64), 0.01, TP, refused="planted refusal (Eq 5)")
    r = ctrl.requests[0]
    assert r.state is State.REJECTED and ctrl.running == []
    assert "KV pool (4 pages of 16 tokens per layer and rank) only in CP, not in TP" in r.reason, r.reason
    assert "the switch to CP was refused: planted refusal (Eq 5)" in r.reason, r.reason
    assert [(s.src, s.dst, s.refused) for s in ctrl.switches] == [(TP, CP, "planted refusal (Eq 5)")]
    after = ctrl.plan(1, T=2, page_size=16)
    assert after.releases == (0,) and after.layout is TP and [q.id for q in after.requests] == [1]


def test_a_started_request_with_no_room_left_where_the_group_is_ends_instead_of_running_out_of_pages():
    """A request that fed all TP holds while its switch kept being refused (planted: its history is
    set by hand) ends at the next plan with the reason; nothing runs out of pages."""
    cap = KVCapacity(pages=PAGES, page_size=16, T=2, source="test")
    ctrl = _controller(cap, [100])
    ctrl.plan(0, T=2, page_size=16)
    ctrl.requests[0].fed = 64
    plan = ctrl.plan(1, T=2, page_size=16)
    assert plan.command is Command.IDLE and plan.releases == (0,)
    assert "has no room for its next token" in ctrl.requests[0].reason


def _controller(cap: KVCapacity, lengths) -> Controller:
    requests = [Request(RequestSpec(i, n, 10), np.arange(n, dtype=np.int64) % 256) for i, n in enumerate(lengths)]
    return Controller(requests, Wants(TP, TP), cap, concurrency=4, prefill_chunk=128, layout=TP)
