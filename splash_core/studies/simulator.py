"""Deployment simulator: a workload stepped through the cost model under each fixed layout
and under SPLASH. It is a model, not a measurement: every time comes from Eq 10 with the
hardware profile's θ, every switch cost from the planner's manifest through Eq 7.

One simulated engine step: admit queued requests while steps can still run (Eq 6 at one row
per request: a fixed layout admits what fits that layout; SPLASH what the scheduler can then
run without holding admission, which needs a layout that holds the batch and, if it is not
the current one, a switch into it that fits Eq 5; the oracle what fits any layout); give
every decoding request one row and prefilling requests up to
``prefill_chunk`` rows per owner rank, in arrival order (owners are chosen at admission in
every layout, so all policies run the same batches); cost the step in the running layout.
A step never runs in a layout that breaks Eq 6 with its real rows: where its prefill rows'
activations would not fit, the step takes fewer (:attr:`PolicyResult.shrunk_steps` counts them).
Decode-only stretches with no arrival or completion inside are advanced ``decode_stride``
steps at a time, costed at their mid-point context (step time is near-linear in context).

Policies: every fixed layout; SPLASH, which asks the scheduler before every step (or stride)
and adds a switch's exposed time (Eq 7, with layer i−1 computing in the destination layout,
and the re-capture of the destination's decode graph where the switch moves weights) to that
step, and a decode step of a bucket whose graph a switch dropped the capture it makes first
(:class:`~splash_core.planning.graph_costs.HeldGraphs`; only where the profile's backend captures);
and the per-step oracle, which runs every step in its fastest layout that fits Eq 6 and
switches for free (no policy that switches can do better on these batches).

Throughput is the paper's total throughput: Σ (input + output tokens) / total time.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

from ..layouts import LAYOUTS, Layout
from ..planning.costmodel import BatchArrays, CostModel, Estimates, switch_cost
from ..planning.graph_costs import HeldGraphs
from ..planning.manifest import plan_switch
from ..planning.ownership import assign_owner
from ..planning.scheduler import HOLD, Scheduler
from ..profiles.workload import RequestSpec

SPLASH, ORACLE = "SPLASH", "oracle"
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
    recapture_s: float = 0.0  # of exposed_s: capturing the destination's decode graph again


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
    held_steps: int  # steps SPLASH held admission (the batch with the next request fit no layout it could run)
    trace: tuple[tuple[float, str, int], ...]  # (time, layout, running requests) per step group
    shrunk_steps: int = 0  # steps that took fewer prefill rows so their activations fit Eq 6
    peak_need_bytes: float = 0.0  # the largest Eq 6 need of a step in its layout (busiest rank)
    lazy_captures: int = 0  # decode graphs captured on first use after a switch (beyond the switches' own)
    lazy_capture_s: float = 0.0  # their time (in total_time_s)

    @property
    def throughput(self) -> float:
        return self.tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    @property
    def switch_time_s(self) -> float:
        """Time the switches added (Eq 7's exposed part, summed)."""
        return sum(s.exposed_s for s in self.switches)

    def summary(self) -> dict:
        return {"policy": self.policy, "throughput_tokens_per_s": self.throughput, "total_time_s": self.total_time_s,
                "tokens": self.tokens, "steps": self.steps, "layout_steps": self.layout_steps,
                "switches": [dataclasses.asdict(s) for s in self.switches], "switch_time_s": self.switch_time_s,
                "rejected": list(self.rejected), "held_steps": self.held_steps, "shrunk_steps": self.shrunk_steps,
                "peak_need_gib": self.peak_need_bytes / (1 << 30), "lazy_captures": self.lazy_captures,
                "lazy_capture_s": self.lazy_capture_s}


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
        fixed = [r for r in self.results if r.policy not in (SPLASH, ORACLE)]
        complete = [r for r in fixed if not r.rejected] or fixed
        return max(complete, key=lambda r: r.throughput, default=None)

    @property
    def splash_ratio(self) -> float | None:
        """SPLASH's throughput over the best fixed layout's."""
        return self.ratio(SPLASH)

    def phases(self, policy: str = SPLASH) -> list[dict]:
        """``policy``'s run cut where its layout changes: per phase the layout, when it began and
        ended (s) and the requests running at its first and last step group."""
        out: list[dict] = []
        start = 0.0
        for end, layout, running in self.result(policy).trace:
            if out and out[-1]["layout"] == layout:
                out[-1].update(end_s=end, running_at_end=running)
            else:
                out.append({"layout": layout, "start_s": start, "end_s": end, "running_at_start": running,
                            "running_at_end": running})
            start = end
        return out

    def regret(self, policy: str = SPLASH) -> dict[str, float]:
        """``policy``'s time over each fixed layout's that served every request (< 1: it wins)."""
        mine = self.result(policy).total_time_s
        return {r.policy: mine / r.total_time_s for r in self.results
                if r.policy not in (SPLASH, ORACLE) and not r.rejected and r.total_time_s > 0}

    def ratio(self, policy: str) -> float | None:
        """``policy``'s throughput over the best fixed layout's."""
        best = self.best_fixed
        mine = next((r for r in self.results if r.policy == policy), None)
        if best is None or mine is None or best.throughput == 0:
            return None
        return mine.throughput / best.throughput


def simulate(deployment, workload, *, policies=(*LAYOUTS, SPLASH, ORACLE), prefill_chunk: int = 8192,
             decode_stride: int = 32) -> Simulation:
    """Serve ``workload`` on ``deployment`` under each policy (a Layout, "SPLASH" or "oracle"), modelled."""
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
        self.splash, self.oracle = policy == SPLASH, policy == ORACLE
        self.policy = str(policy) if self.splash or self.oracle else str(Layout.parse(str(policy)))
        self.layout = deployment.initial_layout if self.splash or self.oracle else Layout.parse(str(policy))
        self.scheduler = Scheduler(deployment, cost) if self.splash else None
        # SPLASH's captured decode graphs (fixed layouts keep their start-up captures; the oracle switches free)
        self.graphs = (HeldGraphs.at_start(cost.graph_costs, self.layout, workload.concurrency)
                       if self.splash and cost.graph_costs is not None else None)
        self.queue = collections.deque(sorted(workload.requests(), key=lambda r: (r.arrival_s, r.id)))
        self.limit = workload.concurrency
        self.budget = deployment.memory_budget_bytes - deployment.common_bytes - deployment.reserve_bytes
        self.projected = np.zeros(deployment.T, dtype=np.int64)  # owners' projected KV (admission)
        self.running: list[_Running] = []
        self.now, self.steps, self.since_switch, self.held, self.shrunk, self.peak = 0.0, 0, math.inf, 0, 0, 0.0
        self.admission_blocked = False  # the last admission attempt failed for memory
        self.fitting_chunk = chunk  # prefill rows per owner the last step ran with
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
        lazy = (0, 0.0) if self.graphs is None else (self.graphs.lazy, self.graphs.lazy_s)
        return PolicyResult(self.policy, self.now, self.served_tokens, self.steps,
                            {str(k): v for k, v in self.layout_steps.items()}, tuple(self.switches),
                            tuple(self.rejected), self.held, tuple(self.trace), self.shrunk, self.peak, *lazy)

    # ---- admission ----------------------------------------------------------------------

    def _need(self, x: BatchArrays) -> np.ndarray:
        """Eq 6's W + K + A of every layout at its busiest rank (M0 and R left out)."""
        return self.cost.evaluate(x).memory_bytes.max(axis=1)

    def _runnable(self, members: list[_Running]) -> bool:
        """Whether the policy can run steps with ``members`` admitted: Eq 6 at one row per
        request (a step can always take fewer prefill rows, :meth:`_step`), and for SPLASH
        Eq 5 into the layout that holds them."""
        x = self._arrays(members, [1] * len(members), [0] * len(members))
        ok = self._need(x) <= self.budget
        if self.oracle:
            return bool(ok.any())
        if not self.splash:
            return bool(ok[LAYOUTS.index(self.layout)])
        return self.scheduler.decide(x, self.layout, self.since_switch).action != HOLD

    def _admit(self) -> None:
        while self.queue and self.queue[0].arrival_s <= self.now and len(self.running) < self.limit:
            spec = self.queue[0]
            owner = assign_owner(self.projected)
            candidate = _Running(spec, owner)
            if self._runnable(self.running + [candidate]):
                self.queue.popleft()
                self.running.append(candidate)
                self.projected[owner] += candidate.reserved
            elif not self.running:  # it cannot fit even alone: no layout of this policy holds it
                self.rejected.append(self.queue.popleft().id)
            else:
                self.admission_blocked = True
                if self.splash:
                    self.held += 1
                break

    # ---- one step (or a decode stride) --------------------------------------------------

    def _arrays(self, members, rows, extra) -> BatchArrays:
        """Contexts include this step's rows (a prefill chunk, or the token being decoded)."""
        contexts = [r.prefilled + q if r.prefilled < r.spec.prompt_tokens else r.spec.prompt_tokens + r.generated + e
                    for r, q, e in zip(members, rows, extra)]
        return BatchArrays.of(contexts, [r.owner for r in members], query_rows=rows,
                              ids=[r.spec.id for r in members], reserved=[r.reserved for r in members])

    def _rows(self, running: list[_Running], chunk: int | None = None) -> tuple[list[_Running], list[int]]:
        """A step's query rows per running request: every decoding request gets one row;
        prefilling requests share ``chunk`` (default ``prefill_chunk``) rows per owner, in
        arrival order. Owners exist in every layout (chosen at admission), so every policy
        computes the same batches and the layouts compare like for like. A request left
        without rows still holds its KV (it stays in the batch)."""
        budget = [self.chunk if chunk is None else chunk] * self.dep.T
        members, rows = [], []
        for r in running:
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
        members, rows, x, est = self._fitting_step()
        k = self._decode_steps(members)
        if k > 1:
            est = self.cost.evaluate(self._arrays(members, rows, [(k - 1) // 2] * len(members)))
        step_s = float(est.total_s[LAYOUTS.index(self.layout)])
        if self.graphs is not None:  # a decode step of a bucket without its graph captures it first
            self.now += self.graphs.step(self.layout, x)
        self.now += k * step_s
        self.steps += k
        self.layout_steps[self.layout] += k
        self.trace.append((self.now, str(self.layout), len(self.running)))
        self._advance(members, rows, k)
        self._retire_finished()
        if self.splash:
            self.since_switch += k

    def _fitting_step(self) -> tuple[list[_Running], list[int], BatchArrays, Estimates]:
        """The step's members, rows, batch and estimates, with fewer prefill rows until the
        step's activations fit its layout (Eq 6); SPLASH decides and the oracle picks its layout
        on the way."""
        chunk, shrunk = self.fitting_chunk, False
        while True:
            members, rows = self._rows(self.running, chunk)
            x = self._arrays(members, rows, [0] * len(members))
            if self.splash:
                self._decide(x)
            est = self.cost.evaluate(x)
            need = est.memory_bytes.max(axis=1)
            if self.oracle:
                fits = need <= self.budget
                if fits.any():
                    self.layout = LAYOUTS[int(np.argmin(np.where(fits, est.total_s, np.inf)))]
            if need[LAYOUTS.index(self.layout)] <= self.budget:
                break
            if chunk <= 1 or all(q == 1 for q in rows):
                raise RuntimeError(f"{self.policy}: a step of {len(members)} requests breaks Eq 6 in "
                                   f"{self.layout} even without prefill rows (admission let it in)")
            chunk, shrunk = chunk // 2, True
            self.shrunk += 1
        self.fitting_chunk = chunk if shrunk else min(self.chunk, 2 * chunk)  # try more rows next time
        self.peak = max(self.peak, float(need[LAYOUTS.index(self.layout)]))
        return members, rows, x, est

    def _decode_steps(self, members: list[_Running]) -> int:
        """How many steps to advance at once: a decode-only stretch runs up to ``decode_stride``."""
        k = 1
        if all(r.prefilled >= r.spec.prompt_tokens for r in members):
            k = min(self.stride, min(r.spec.max_new_tokens - r.generated for r in members))
            if self.queue and len(self.running) < self.limit and not self.admission_blocked:
                k = 1  # a queued request may be admitted after the next step
        return k

    def _advance(self, members: list[_Running], rows: list[int], k: int) -> None:
        for r, q in zip(members, rows):
            if r.prefilled < r.spec.prompt_tokens:
                r.prefilled += q
                if r.prefilled >= r.spec.prompt_tokens:
                    r.generated = 1  # the last prefill chunk yields the first output token
            else:
                r.generated += k

    def _retire_finished(self) -> None:
        for r in [r for r in self.running if r.generated >= r.spec.max_new_tokens]:
            self.running.remove(r)
            self.projected[r.owner] -= r.reserved
            self.served_tokens += r.reserved
            self.admission_blocked = False  # memory freed: admission may succeed again

    def _decide(self, x: BatchArrays) -> None:
        """Ask the scheduler; on a switch, charge its exposed time (Eq 7, with the re-capture of
        the destination's decode graph where the switch moves weights) and move."""
        decision = self.scheduler.decide(x, self.layout, self.since_switch)
        if not decision.switch:
            return
        manifest = decision.manifest or plan_switch(self.layout, decision.layout, x.history_batch(), self.cost.model,
                                                    self.cost.T, self.cost.page_size, layers=self.scheduler.layers)
        cost = switch_cost(manifest, self.cost, decision.estimates.step_time(decision.layout), x)
        self.switches.append(SwitchEvent(self.steps, self.now, self.layout, decision.layout, cost.exposed_s,
                                         cost.blocking_s, int(manifest.fetched_bytes().sum()), decision.reason,
                                         cost.recapture_s))
        if self.graphs is not None:
            self.graphs.switch(self.layout, decision.layout, x)
        self.now += cost.exposed_s
        self.layout, self.since_switch = decision.layout, 0
