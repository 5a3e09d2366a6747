"""Rank 0's half of the engine: admission, batch composition and the layout of every step.

Each step (:meth:`Controller.plan`): admit arrived requests (unless the last decision held
admission), give every decoding request one row and the prefilling ones up to ``prefill_chunk``
rows per owner rank in admission order, ask the policy for the layout, and check the layout
against the KV pool. A request that has fed any token holds KV, so it gets at least one row
in every step until it finishes: a switch moves exactly the histories of the step's batch.
A step that must leave a layout too small for the running requests (admitted while nothing ran,
for another layout) feeds only what that layout holds, since a refused switch runs the step
there; if the switch is refused, those requests end, rejected with the reason, instead of a
later step running out of pages.
After the step, :meth:`Controller.record` turns the chosen tokens into progress and finished
requests, whose pages the next plan releases. Or, where the step can be booked before its tokens
are known (:meth:`Controller.book_ahead`: a step in the current layout, its sampled outputs
drawn in the plan), the next step is planned while the device still runs this one and
:meth:`Controller.confirm` books the tokens once they reach the host.

A workload's requests arrive at their ``arrival_s``; with nothing to run before the next
arrival the controller waits (at most ``idle_s``) and plans an IDLE step. A server's controller
is ``open_ended``: requests come through :meth:`Controller.add` as clients send them, leave
early through :meth:`Controller.abort` (their pages are freed by the next plan, IDLE or not), and
the run ends only after :meth:`Controller.close`, once every request is done.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time

import numpy as np

from ..layouts import LAYOUTS, Layout
from ..planning.costmodel import BatchArrays
from ..runtime.step_batch import StepBatch, StepRequest
from .admission import Admission, KVCapacity
from .draws import step_sampling
from .plan import Command, StepPlan
from .policy import Choice
from .precopies import AT_ONCE, FELL_BACK, HANDED_OFF, OUTCOMES, PreCopyRecord
from .requests import Request, State


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one step did (rank 0's view)."""

    step: int
    layout: Layout
    requests: int
    rows: int
    seconds: float  # wall time of the step on rank 0, switch included
    # how it was booked: "ahead" (the next step was planned before its tokens were on the host), else why
    # the host waited for them first: "switch", "precopy" or "sync" (overlap off)
    booked: str = "ahead"
    # device time of the step on rank 0 (timing events around its work on the compute stream): where the
    # host stalls inside a launch, wall time books the stall to the step before and this does not
    device_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class SwitchRecord:
    """A switch the engine attempted: ``refused`` says why it did not happen (then the step ran
    in ``src``); the bytes and times come from the switch executor's reports."""

    step: int
    src: Layout
    dst: Layout
    reason: str
    refused: str = ""
    precopy: PreCopyRecord | None = None  # the pre-copy it handed off, or that fell back to it


class Controller:
    """Requests and decisions, on rank 0 only."""

    def __init__(self, requests: list[Request], policy, capacity: KVCapacity, *, concurrency: int,
                 prefill_chunk: int, layout: Layout, open_ended: bool = False, idle_s: float = 1.0):
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
        self.switch_check = None  # the scheduler's Eq 5 check of the planned step's switch (SwitchCheck), if any
        self.releases: list[int] = []
        self.steps: list[StepRecord] = []
        self.switches: list[SwitchRecord] = []
        self.decisions: collections.Counter = collections.Counter()  # policy action -> steps
        self.precopies: list[PreCopyRecord] = []  # every pre-copy begun (rank 0's records)
        self.precopy_counts = collections.Counter({k: 0 for k in ("begun",) + OUTCOMES})
        self.precopy_events: tuple[PreCopyRecord, ...] = ()  # the records that began or ended in the last step
        self.ahead: dict[int, tuple[tuple[int, int], ...]] = {}  # step booked ahead -> its outputs (row, request id)
        self.open, self.idle_s = open_ended, idle_s
        self.start = time.monotonic()

    # ---- before a step ------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Nothing to run now, nor anything that has arrived and waits."""
        return not (self.running or self.queue)

    def plan(self, step: int, T: int, page_size: int) -> StepPlan:
        """The next step's plan; IDLE (with the releases) when nothing can run yet; STOP (with the
        last releases) when every request is done and no more can come."""
        self._arrive()
        if not self.hold or not self.running:  # holding admission with nothing running would stall
            self.admission.admit(self.queue, self.running, self.layout, step)
        self.hold = False
        if not self.running:
            if self.queue:
                raise RuntimeError(f"step {step}: request {self.queue[0].id} can be neither admitted nor "
                                   f"rejected with nothing running (admission bug)")
            if not (self.pending or self.open):
                return StepPlan(Command.STOP, step, self.layout, releases=self._take_releases())
            if self.pending:  # wait for the next arrival, at most idle_s (the other ranks wait in the broadcast)
                time.sleep(min(self.idle_s, max(0.0, self.pending[0].spec.arrival_s - self._now())))
            return StepPlan(Command.IDLE, step, self.layout, releases=self._take_releases())
        rows = self._rows(T)
        choice = self.policy.decide(self._arrays(rows), self.layout, self.since_switch, step)
        self.decisions[choice.action] += 1
        self.hold, self.reason = choice.hold, choice.reason
        layout = self._fitting(choice, step)
        self.switch_check = choice.switch if layout is choice.layout else None
        precopy_steps = choice.precopy_steps if layout is choice.layout else 0
        if layout is not self.layout and not self._holds(self.layout):
            rows, precopy_steps = self._within_current(rows, step), AT_ONCE  # no step can wait here for a pre-copy
            self.switch_check = None  # the scheduler checked the uncut batch: the executor checks this one
            if not self.running:
                return StepPlan(Command.IDLE, step, self.layout, releases=self._take_releases())
        members = [StepRequest(r.id, r.owner, r.fed, q) for r, q in zip(self.running, rows) if q]
        batch = StepBatch.build(members, T, page_size)
        by_id = {r.id: r for r in self.running}
        tokens = np.concatenate([by_id[q.id].feed(q.rows) for q in batch.requests])
        sampling = step_sampling(batch.requests, by_id)
        return StepPlan(Command.STEP, step, layout, batch.requests, tokens, self._take_releases(),
                        precopy_steps=precopy_steps,
                        draws=sampling.draws, tracked=sampling.tracked, scored=sampling.scored)

    def _arrive(self) -> None:
        now = self._now()
        while self.pending and self.pending[0].spec.arrival_s <= now:
            request = self.pending.popleft()
            request.arrived_at = self.start + request.spec.arrival_s
            self.queue.append(request)

    # ---- requests that come and go (a server) ---------------------------------------------

    def add(self, request: Request) -> None:
        """A request that arrived now (its id unused so far)."""
        if request.id in self.requests:
            raise ValueError(f"request {request.id} was added before")
        request.arrived_at = time.monotonic()
        self.requests[request.id] = request
        self.queue.append(request)

    def abort(self, ids, step: int) -> list[Request]:
        """Stop the requests ``ids`` that are not done yet (unknown ids are ignored); the next plan
        frees their pages on every rank. Returns the requests aborted."""
        gone = [self.requests[i] for i in ids if i in self.requests and not self.requests[i].done]
        if not gone:
            return []
        for r in gone:
            if r.state is not State.WAITING:
                self.releases.append(r.id)
            r.abort(step)
        out = set(r.id for r in gone)
        self.queue = collections.deque(r for r in self.queue if r.id not in out)
        self.running = [r for r in self.running if r.id not in out]
        return gone

    def close(self) -> None:
        """No more requests will come: the run stops once every request is done."""
        self.open = False

    def forget(self, ids) -> None:
        """Drop done requests from the books (a server keeps only the live ones)."""
        for i in ids:
            if i in self.requests and self.requests[i].done:
                del self.requests[i]

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

    def _holds(self, layout: Layout) -> bool:
        """Whether the KV pool holds the running requests, at their reserved lengths, in ``layout``."""
        return bool(self.capacity.fits(self.running)[LAYOUTS.index(layout)])

    def _within_current(self, rows: list[int], step: int) -> list[int]:
        """The step moves away from a layout that cannot hold the running requests (admitted while
        nothing ran, for another layout). If the switch is refused the step runs where it is, so it
        feeds only what the current layout holds; a started request with no room left there ends."""
        cut = self.capacity.rows_within(self.running, rows, self.layout)
        for r, q in zip(self.running, cut):
            if q == 0 and r.started:
                self._end_unheld(r, f"the current layout {self.layout} has no room for its next token")
        return [q for r, q in zip(self.running, cut) if not r.done]

    def _end_unheld(self, r: Request, why: str) -> None:
        """End running request ``r``, which the current layout cannot hold: rejected with the limit and ``why``."""
        fits = [str(layout) for layout, ok in zip(LAYOUTS, self.capacity.fits([r])) if ok]
        r.reject(f"{r.prompt_tokens} prompt + {r.spec.max_new_tokens} output tokens fit the KV pool "
                 f"({self.capacity.pages} pages of {self.capacity.page_size} tokens per layer and rank) only in "
                 f"{', '.join(fits) or 'no layout'}, not in {self.layout}, and {why}")
        if r.started:
            self.releases.append(r.id)
        self.running = [x for x in self.running if x is not r]

    def _end_stranded(self, wanted: Layout, refused: str) -> None:
        """After the switch to ``wanted`` was refused: the running requests the current layout cannot
        hold end, newest first (the step fed them only what fits here, :meth:`_within_current`)."""
        while self.running and not self._holds(self.layout):
            self._end_unheld(self.running[-1], f"the switch to {wanted} was refused: {refused}")

    def _take_releases(self) -> tuple[int, ...]:
        out, self.releases = tuple(self.releases), []
        return out

    # ---- after a step -------------------------------------------------------------------

    def book_ahead(self, plan: StepPlan) -> None:
        """Book ``plan``'s step (run in the current layout) before its tokens are known, so the
        next step can be planned now: progress, finishing by length and the releases are known;
        the tokens and any stop id come with :meth:`confirm`."""
        if plan.layout is not self.layout:
            raise RuntimeError(f"step {plan.step}: a switching step cannot be booked ahead of its tokens")
        self.since_switch += 1
        outputs = []
        for row, q in enumerate(plan.requests):
            r = self.requests.get(q.id)
            if r is None or r.done:  # aborted after its step was planned, or stopped in the step before
                continue
            if r.advance_ahead(q.rows, plan.step, row):
                outputs.append((row, r.id))
            if r.state is State.FINISHED:
                self.releases.append(r.id)
        self.ahead[plan.step] = tuple(outputs)
        self.running = [r for r in self.running if r.state is not State.FINISHED]

    def confirm(self, plan: StepPlan, next_tokens: np.ndarray, seconds: float,
                device_seconds: float | None = None) -> list[Request]:
        """The tokens of a step booked ahead (:meth:`book_ahead`). Returns the requests that
        generated a token; one that emitted a stop id finishes here and the next plan releases it
        (a request a server forgot after it was aborted is skipped)."""
        now, produced = time.monotonic(), []
        for row, rid in self.ahead.pop(plan.step):
            r = self.requests.get(rid)
            if r is None or not r.confirm(int(next_tokens[row]), plan.step):
                continue
            r.token_times.append(now)
            produced.append(r)
            if r.finish_reason == "stop" and r in self.running:
                self.releases.append(r.id)
        self.running = [r for r in self.running if r.state is not State.FINISHED]
        self._step_record(plan, self.layout, seconds, "ahead", device_seconds)
        return produced

    def _step_record(self, plan: StepPlan, ran_in: Layout, seconds: float, booked: str,
                     device_seconds: float | None) -> None:
        self.steps.append(StepRecord(plan.step, ran_in, len(plan.requests), int(sum(q.rows for q in plan.requests)),
                                     seconds, booked, device_seconds))

    def record(self, plan: StepPlan, next_tokens: np.ndarray, seconds: float, ran_in: Layout,
               refused: str = "", precopying: bool = False, precopies=(), booked: str = "sync",
               device_seconds: float | None = None) -> list[Request]:
        """Book the step: ``next_tokens`` are the chosen tokens of the batch's requests, in batch
        order; ``ran_in`` the layout the step ended in; ``refused`` why the executor refused the
        plan's switch, if it did; ``precopying``: the step ran beside a pre-copy to the plan's
        layout (the switch is booked at its handoff); ``precopies``: the pre-copy records that
        began or ended in the step; ``booked``: why the host waited for the tokens before planning
        the next step (:attr:`StepRecord.booked`); ``device_seconds`` its device time, where measured.
        Returns the requests that generated a token."""
        self.precopy_events = tuple(precopies)
        for r in precopies:
            if r.begun == plan.step:
                self.precopies.append(r)
                self.precopy_counts["begun"] += 1
            if r.ended == plan.step:
                self.precopy_counts[r.outcome] += 1
        if plan.layout is not self.layout and not precopying:
            led = next((r for r in precopies if r.ended == plan.step and r.outcome in (HANDED_OFF, FELL_BACK)
                        and r.dst == str(plan.layout)), None)
            self.switches.append(SwitchRecord(plan.step, self.layout, plan.layout, self.reason, refused, led))
        if ran_in is not self.layout:
            self.layout, self.since_switch = ran_in, 0
        else:
            self.since_switch += 1
        now, produced = time.monotonic(), []
        for req, token in zip(plan.requests, next_tokens.tolist()):
            r = self.requests.get(req.id)
            if r is None or r.done:  # stopped in the step before, found only after this one was planned
                continue
            before = len(r.generated)
            r.advance(req.rows, token, plan.step)
            if len(r.generated) > before:
                r.token_times.append(now)
                produced.append(r)
            if r.state is State.FINISHED:
                self.releases.append(r.id)
        self.running = [r for r in self.running if r.state is not State.FINISHED]
        if refused:
            self._end_stranded(plan.layout, refused)
        self._step_record(plan, ran_in, seconds, booked, device_seconds)
        return produced

