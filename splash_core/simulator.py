"""Deployment simulator: a workload stepped through the cost model under each fixed layout
and under SPLASH. It is a model, not a measurement: every time comes from Eq 10 with the
hardware profile's θ, every switch cost from the planner's manifest through Eq 7.

One simulated engine step: admit queued requests while the batch still fits (a fixed layout
admits what fits that layout, Eq 6; SPLASH what fits some layout, since the scheduler then
moves to one that holds it); give every decoding request one row and prefilling requests up
to ``prefill_chunk`` rows per owner rank, in arrival order (owners are chosen at admission
in every layout, so all policies run the same batches); cost the step in the running layout.
Decode-only stretches with no arrival or completion inside are advanced ``decode_stride``
steps at a time, costed at their mid-point context (step time is near-linear in context).
SPLASH asks the scheduler before every step (or stride); a switch adds its exposed time
(Eq 7, with layer i−1 computing in the destination layout) to that step.

Throughput is the paper's total throughput: Σ (input + output tokens) / total time.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

from .costmodel import BatchArrays, CostModel, switch_cost
from .layouts import LAYOUTS, Layout
from .manifest import plan_switch
from .ownership import assign_owner
from .profiles.workload import RequestSpec
from .scheduler import HOLD, Scheduler

SPLASH = "SPLASH"
MODEL_NOTE = ("a model, not a measurement: step times from the cost model (Eq 10) with the hardware "
              "profile's θ, switch costs from the planner's manifests through Eq 7")


@dataclasses.dataclass
class _Running:
    spec: RequestSpec
    owner: int
    prefilled: int = 0
    generated: int = 0

    @property
    def reserved(self) -> int:
        return self.spec.prompt_tokens + self.spec.max_new_tokens


@dataclasses.dataclass(frozen=True)
class SwitchEvent:
    """One switch SPLASH made."""

    step: int
    time_s: float
    src: Layout
    dst: Layout
    exposed_s: float  # Eq 7
    blocking_s: float  # all layers' transfers back to back
    fetched_bytes: int  # received over the group, all layers and states
    reason: str


@dataclasses.dataclass(frozen=True)
class PolicyResult:
    """How one policy (a fixed layout or SPLASH) serves the workload, modelled."""

    policy: str
    total_time_s: float
    tokens: int  # input + output tokens served
    steps: int
    layout_steps: dict  # layout name -> steps run in it
    switches: tuple[SwitchEvent, ...]
    rejected: tuple[int, ...]  # ids of requests no layout of the policy can ever hold
    held_steps: int  # steps SPLASH held admission (no feasible switch)
    trace: tuple[tuple[float, str, int], ...]  # (time, layout, running requests) per step group

    @property
    def throughput(self) -> float:
        return self.tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    def summary(self) -> dict:
        return {"policy": self.policy, "throughput_tokens_per_s": self.throughput, "total_time_s": self.total_time_s,
                "tokens": self.tokens, "steps": self.steps, "layout_steps": self.layout_steps,
                "switches": [dataclasses.asdict(s) for s in self.switches], "rejected": list(self.rejected),
                "held_steps": self.held_steps}


@dataclasses.dataclass(frozen=True)
class Simulation:
    """Every policy's result for one deployment and workload."""

    deployment: str
    workload: str
    prefill_chunk: int
    results: tuple[PolicyResult, ...]
    note: str = MODEL_NOTE

    def result(self, policy: str) -> PolicyResult:
        return next(r for r in self.results if r.policy == policy)

    @property
    def best_fixed(self) -> PolicyResult | None:
        """The fastest fixed layout among those that served every request (else among all)."""
        fixed = [r for r in self.results if r.policy != SPLASH]
        complete = [r for r in fixed if not r.rejected] or fixed
        return max(complete, key=lambda r: r.throughput, default=None)

    @property
    def splash_ratio(self) -> float | None:
        """SPLASH's throughput over the best fixed layout's."""
        best = self.best_fixed
        splash = next((r for r in self.results if r.policy == SPLASH), None)
        if best is None or splash is None or best.throughput == 0:
            return None
        return splash.throughput / best.throughput


def simulate(deployment, workload, *, policies=(*LAYOUTS, SPLASH), prefill_chunk: int = 8192,
             decode_stride: int = 32) -> Simulation:
    """Serve ``workload`` on ``deployment`` under each policy (Layout or "SPLASH"), modelled."""
    if prefill_chunk < 1 or decode_stride < 1:
        raise ValueError("prefill_chunk and decode_stride must be >= 1")
    cost = CostModel.from_deployment(deployment)
    results = tuple(_Run(deployment, workload, cost, policy, prefill_chunk, decode_stride).serve()
                    for policy in policies)
    return Simulation(deployment.name, workload.name, prefill_chunk, results)


class _Run:
    """One policy serving one workload."""

    def __init__(self, deployment, workload, cost: CostModel, policy, chunk: int, stride: int):
        self.dep, self.cost, self.chunk, self.stride = deployment, cost, chunk, stride
        self.splash = policy == SPLASH
        self.policy = SPLASH if self.splash else str(Layout.parse(str(policy)))
        self.layout = deployment.initial_layout if self.splash else Layout.parse(str(policy))
        self.scheduler = Scheduler(deployment, cost) if self.splash else None
        self.queue = collections.deque(sorted(workload.requests(), key=lambda r: (r.arrival_s, r.id)))
        self.limit = workload.concurrency
        self.budget = deployment.memory_budget_bytes - deployment.common_bytes - deployment.reserve_bytes
        self.projected = np.zeros(deployment.T, dtype=np.int64)  # owners' projected KV (admission)
        self.running: list[_Running] = []
        self.now, self.steps, self.since_switch, self.held = 0.0, 0, math.inf, 0
        self.hold_admission = False
        self.admission_blocked = False  # the last admission attempt failed for memory
        self.layout_steps: collections.Counter = collections.Counter()
        self.switches: list[SwitchEvent] = []
        self.rejected: list[int] = []
        self.served_tokens = 0
        self.trace: list[tuple[float, str, int]] = []

    def serve(self) -> PolicyResult:
        while self.queue or self.running:
            self._admit()
            if not self.running:
                if self.queue:  # idle until the next arrival
                    self.now = max(self.now, self.queue[0].arrival_s)
                continue
            self._step()
        return PolicyResult(self.policy, self.now, self.served_tokens, self.steps,
                            {str(k): v for k, v in self.layout_steps.items()}, tuple(self.switches),
                            tuple(self.rejected), self.held, tuple(self.trace))

    # ---- admission -------------------------------------------------------------------

    def _fits(self, members: list[_Running]) -> bool:
        x = self._arrays(members, [1] * len(members), [0] * len(members))
        need = self.cost.evaluate(x).memory_bytes.max(axis=1)
        ok = need <= self.budget
        return bool(ok.any() if self.splash else ok[LAYOUTS.index(self.layout)])

    def _admit(self) -> None:
        if self.hold_admission:
            self.hold_admission = False
            return
        while self.queue and self.queue[0].arrival_s <= self.now and len(self.running) < self.limit:
            spec = self.queue[0]
            owner = assign_owner(self.projected)
            candidate = _Running(spec, owner)
            if self._fits(self.running + [candidate]):
                self.queue.popleft()
                self.running.append(candidate)
                self.projected[owner] += candidate.reserved
            elif not self.running:  # it cannot fit even alone: no layout of this policy holds it
                self.rejected.append(self.queue.popleft().id)
            else:
                self.admission_blocked = True
                break

    # ---- one step (or a decode stride) --------------------------------------------------

    def _arrays(self, members, rows, extra) -> BatchArrays:
        """Contexts include this step's rows (a prefill chunk, or the token being decoded)."""
        contexts = [r.prefilled + q if r.prefilled < r.spec.prompt_tokens else r.spec.prompt_tokens + r.generated + e
                    for r, q, e in zip(members, rows, extra)]
        return BatchArrays.of(contexts, [r.owner for r in members], query_rows=rows,
                              ids=[r.spec.id for r in members], reserved=[r.reserved for r in members])

    def _rows(self) -> tuple[list[_Running], list[int]]:
        """This step's query rows per running request: every decoding request gets one row;
        prefilling requests share ``prefill_chunk`` rows per owner, in arrival order. Owners
        exist in every layout (chosen at admission), so every policy computes the same
        batches and the layouts compare like for like. A request left without rows still
        holds its KV (it stays in the batch)."""
        budget = [self.chunk] * self.dep.T
        members, rows = [], []
        for r in self.running:
            if r.prefilled < r.spec.prompt_tokens:
                take = min(budget[r.owner], r.spec.prompt_tokens - r.prefilled)
                budget[r.owner] -= take
                members.append(r)
                rows.append(take)
            else:
                members.append(r)
                rows.append(1)
        return members, rows

    def _step(self) -> None:
        members, rows = self._rows()
        if self.splash:
            self._decide(self._arrays(members, rows, [0] * len(members)))
        k = 1
        if all(r.prefilled >= r.spec.prompt_tokens for r in members):
            k = min(self.stride, min(r.spec.max_new_tokens - r.generated for r in members))
            if self.queue and len(self.running) < self.limit and not self.admission_blocked:
                k = 1  # a queued request may be admitted after the next step
        x_now = self._arrays(members, rows, [0] * len(members))
        x_mid = self._arrays(members, rows, [(k - 1) // 2] * len(members)) if k > 1 else x_now
        step_s = float(self.cost.evaluate(x_mid).total_s[LAYOUTS.index(self.layout)])
        self.now += k * step_s
        self.steps += k
        self.layout_steps[self.layout] += k
        self.trace.append((self.now, str(self.layout), len(self.running)))
        for r, q in zip(members, rows):
            if r.prefilled < r.spec.prompt_tokens:
                r.prefilled += q
                if r.prefilled >= r.spec.prompt_tokens:
                    r.generated = 1  # the last prefill chunk yields the first output token
            else:
                r.generated += k
        for r in [r for r in self.running if r.generated >= r.spec.max_new_tokens]:
            self.running.remove(r)
            self.projected[r.owner] -= r.reserved
            self.served_tokens += r.reserved
            self.admission_blocked = False  # memory freed: admission may succeed again
        if self.splash:
            self.since_switch += k

    def _decide(self, x: BatchArrays) -> None:
        """Ask the scheduler; on a switch, charge its exposed time (Eq 7) and move."""
        decision = self.scheduler.decide(x, self.layout, self.since_switch)
        if decision.action == HOLD:
            self.held += 1
            self.hold_admission = True
        if not decision.switch:
            return
        manifest = decision.manifest or plan_switch(self.layout, decision.layout, x.to_batch(), self.cost.model,
                                                    self.cost.T, self.cost.page_size, layers=self.scheduler.layers)
        dest = self.cost.evaluate(x).step_time(decision.layout)
        cost = switch_cost(manifest, self.cost, dest)
        self.switches.append(SwitchEvent(self.steps, self.now, self.layout, decision.layout, cost.exposed_s,
                                         cost.blocking_s, int(manifest.fetched_bytes().sum()), decision.reason))
        self.now += cost.exposed_s
        self.layout, self.since_switch = decision.layout, 0
