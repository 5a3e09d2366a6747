"""Rank 0's half of the engine: admission, batch composition and the layout of every step.

Each step (:meth:`Controller.plan`): admit arrived requests (unless the last decision held
admission), give every decoding request one row and the prefilling ones up to ``prefill_chunk``
rows per owner rank in admission order, ask the policy for the layout, and check the layout
against the KV pool. A request that has fed any token holds KV, so it gets at least one row
in every step until it finishes: a switch moves exactly the histories of the step's batch.
After the step, :meth:`Controller.record` turns the chosen tokens into progress and finished
requests, whose pages the next plan releases.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time

import numpy as np

from ..costmodel import BatchArrays
from ..layouts import LAYOUTS, Layout
from ..runtime.step_batch import StepBatch, StepRequest
from .admission import Admission, KVCapacity
from .plan import Command, StepPlan
from .policy import Choice
from .requests import Request, State


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one step did (rank 0's view)."""

    step: int
    layout: Layout
    requests: int
    rows: int
    seconds: float  # wall time of the step on rank 0, switch included


@dataclasses.dataclass(frozen=True)
class SwitchRecord:
    """A switch the engine attempted: ``refused`` says why it did not happen (then the step ran
    in ``src``); the bytes and times come from the switch executor's reports."""

    step: int
    src: Layout
    dst: Layout
    reason: str
    refused: str = ""


class Controller:
    """Requests and decisions, on rank 0 only."""

    def __init__(self, requests: list[Request], policy, capacity: KVCapacity, *, concurrency: int,
                 prefill_chunk: int, layout: Layout):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (got {prefill_chunk})")
        self.requests = {r.id: r for r in requests}
        self.pending = collections.deque(sorted(requests, key=lambda r: (r.spec.arrival_s, r.id)))
        self.queue: collections.deque = collections.deque()  # arrived, not yet admitted
        self.running: list[Request] = []
        self.policy, self.capacity, self.chunk = policy, capacity, prefill_chunk
        self.admission = Admission(capacity, concurrency, policy.layouts)
        self.layout, self.since_switch, self.hold = layout, math.inf, False
        self.reason = ""  # the policy's reason for the planned step's layout
        self.eq5_checked = False  # the policy found the planned step's switch fits Eq 5
        self.releases: list[int] = []
        self.steps: list[StepRecord] = []
        self.switches: list[SwitchRecord] = []
        self.decisions: collections.Counter = collections.Counter()  # policy action -> steps
        self.start = time.monotonic()

    # ---- before a step ------------------------------------------------------------------

    def plan(self, step: int, T: int, page_size: int) -> StepPlan:
        """The next step's plan, or STOP (with the last releases) when every request is done."""
        self._arrive()
        if not self.hold or not self.running:  # holding admission with nothing running would stall
            self.admission.admit(self.queue, self.running, self.layout, step)
        self.hold = False
        if not self.running:
            if not (self.pending or self.queue):
                return StepPlan(Command.STOP, step, self.layout, releases=self._take_releases())
            if self.queue:
                raise RuntimeError(f"step {step}: request {self.queue[0].id} can be neither admitted nor "
                                   f"rejected with nothing running (admission bug)")
            # idle until the next arrival (the other ranks wait in the plan broadcast meanwhile, so a
            # gap between arrivals must stay under the collective timeout)
            time.sleep(max(0.0, self.pending[0].spec.arrival_s - self._now()))
            return self.plan(step, T, page_size)
        rows = self._rows(T)
        choice = self.policy.decide(self._arrays(rows), self.layout, self.since_switch, step)
        self.decisions[choice.action] += 1
        self.hold, self.reason = choice.hold, choice.reason
        layout = self._fitting(choice, step)
        self.eq5_checked = choice.eq5_checked and layout is choice.layout
        members = [StepRequest(r.id, r.owner, r.fed, q) for r, q in zip(self.running, rows) if q]
        batch = StepBatch.build(members, T, page_size)
        by_id = {r.id: r for r in self.running}
        tokens = np.concatenate([by_id[q.id].feed(q.rows) for q in batch.requests])
        return StepPlan(Command.STEP, step, layout, batch.requests, tokens, self._take_releases())

    def _arrive(self) -> None:
        now = self._now()
        while self.pending and self.pending[0].spec.arrival_s <= now:
            self.queue.append(self.pending.popleft())

    def _now(self) -> float:
        return time.monotonic() - self.start

    def _rows(self, T: int) -> list[int]:
        """Query rows per running request: 1 when decoding; prefill shares ``chunk`` rows per
        owner in admission order, and a started prefill always gets at least one row."""
        budget = [self.chunk] * T
        rows = []
        for r in self.running:
            if r.state is State.DECODING:
                rows.append(1)
                continue
            take = min(budget[r.owner], r.prompt_tokens - r.fed)
            if take == 0 and r.started:
                take = 1
            budget[r.owner] = max(0, budget[r.owner] - take)
            rows.append(take)
        return rows

    def _arrays(self, rows: list[int]) -> BatchArrays:
        """The step as the scheduler sees it: every admitted request (a request without rows this
        step holds KV but costs nothing), contexts including this step's rows."""
        run = self.running
        return BatchArrays.of([r.fed + q for r, q in zip(run, rows)], [r.owner for r in run], query_rows=rows,
                              ids=[r.id for r in run], reserved=[r.reserved_tokens for r in run])

    def _fitting(self, choice: Choice, step: int) -> Layout:
        """The policy's layout if the KV pool holds the running requests in it; else the current
        layout if it does; else the first of the policy's preferences that does (admission
        guarantees one does)."""
        fits = self.capacity.fits(self.running)
        ok = lambda layout: bool(fits[LAYOUTS.index(layout)])  # noqa: E731
        if ok(choice.layout):
            return choice.layout
        fallback = self.layout if ok(self.layout) else next((l for l in choice.preference if ok(l)), None)
        if fallback is None:
            raise RuntimeError(f"step {step}: no layout of policy {self.policy.name} holds the running requests "
                               f"(admission bug): {choice.reason}")
        short = (f"the KV pool ({self.capacity.pages} pages per layer and rank) cannot hold the running "
                 f"requests in {choice.layout}")
        if choice.layout is not self.layout:
            self.switches.append(SwitchRecord(step, self.layout, choice.layout, choice.reason, refused=short))
        if fallback is not self.layout:
            self.reason = f"{short}; {fallback} is the policy's next choice that can"
        return fallback

    def _take_releases(self) -> tuple[int, ...]:
        out, self.releases = tuple(self.releases), []
        return out

    # ---- after a step -------------------------------------------------------------------

    def record(self, plan: StepPlan, next_tokens: np.ndarray, seconds: float, ran_in: Layout,
               refused: str = "") -> None:
        """Book the step: ``next_tokens`` are the chosen tokens of the batch's requests, in batch
        order; ``ran_in`` the layout the step ended in; ``refused`` why the executor refused the
        plan's switch, if it did."""
        if plan.layout is not self.layout:
            self.switches.append(SwitchRecord(plan.step, self.layout, plan.layout, self.reason, refused))
        if ran_in is not self.layout:
            self.layout, self.since_switch = ran_in, 0
        else:
            self.since_switch += 1
        for req, token in zip(plan.requests, next_tokens.tolist()):
            r = self.requests[req.id]
            r.advance(req.rows, token, plan.step)
            if r.state is State.FINISHED:
                self.releases.append(r.id)
        self.running = [r for r in self.running if r.state is not State.FINISHED]
        self.steps.append(StepRecord(plan.step, ran_in, len(plan.requests), int(sum(q.rows for q in plan.requests)),
                                     seconds))
