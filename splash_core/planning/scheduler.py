"""The transition-aware scheduler π(x; θ) of paper §4.2.

Every step it costs all four layouts (Eq 10, :class:`~splash_core.planning.costmodel.CostModel`, with
the host overheads the hardware profile was calibrated with, if any),
keeps those that fit in steady state (Eq 6: M0 + W + K + A + R ≤ H on every rank, K at the
requests' reserved lengths), and runs the fastest (Eq 8) — but it leaves the current layout
only when another feasible one is faster by at least ``scheduler.margin`` (and not within
``min_steps_between_switches`` of the last switch), and only if the switch itself fits
(Eq 5). A current layout that no longer fits forces a switch to the fastest one whose switch
fits; with none, the decision is to hold admission, with the reason.

Eq 5 is settled by bounds where possible (the peak lies between max(M_a, M_b) and that plus
one layer of both layouts' state), and by the planner (:func:`~splash_core.planning.manifest.plan_switch`)
otherwise, on the histories the switch moves (each request's context before the step); the
check, with its planned manifest, travels with the decision to the switch executor, which
neither plans that manifest nor checks Eq 5 again.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ..formatting import percent
from ..layouts import LAYOUTS, Layout, Ownership
from .costmodel import BatchArrays, CostModel, Estimates
from .graph_costs import moves_weights
from .manifest import Manifest, plan_switch
from .ownership import Batch
from .switch_time import SwitchCost, switch_cost

GIB = float(1 << 30)
STAY, SWITCH, FORCED, HOLD = "stay", "switch", "forced_switch", "hold_admission"


@dataclasses.dataclass(frozen=True)
class SwitchCheck:
    """Eq 5 for one candidate switch: how it was settled and the peak it reaches."""

    fits: bool
    how: str  # "bound" (settled without planning) or "planned"
    peak_bytes: float  # the busiest rank's peak (bound or exact), reserve and M0 included
    manifest: Manifest | None = None
    batch: Batch | None = None  # the histories the manifest was planned for


@dataclasses.dataclass(frozen=True)
class Decision:
    """One scheduling decision with everything needed to explain it.

    ``layout`` is what this step runs; ``action`` is stay, switch, forced_switch or
    hold_admission (which keeps ``current``). The explanation (:attr:`reason`,
    :meth:`explain`, :meth:`as_dict`) is rendered from the numbers on demand."""

    action: str
    layout: Layout
    current: Layout
    estimates: Estimates
    need_bytes: np.ndarray  # [layouts]: busiest rank's M0 + W + K + A + R (Eq 6)
    budget_bytes: float  # H_r
    margin: float
    switch_checks: dict  # Layout -> SwitchCheck, for the candidates Eq 5 was checked for
    note: str = ""  # what decided it, in words
    pool_tokens: np.ndarray | None = None  # [layouts]: distinct tokens each layout's KV pool holds over the group
    demand_tokens: float = 0.0  # distinct tokens the batch reserves (Eq 6's K at the reserved lengths)

    def waves(self, layout: Layout) -> int | None:
        """How many admission waves the batch's reserved KV would take in ``layout``'s pool were
        it admitted in waves (1: it all fits at once; None: the pool holds nothing)."""
        pool = None if self.pool_tokens is None else float(self.pool_tokens[LAYOUTS.index(layout)])
        if pool is None or pool <= 0:
            return None
        return max(1, math.ceil(self.demand_tokens / pool))

    @property
    def switch(self) -> bool:
        return self.layout is not self.current

    @property
    def manifest(self) -> Manifest | None:
        check = self.switch_checks.get(self.layout)
        return check.manifest if check else None

    def fits_steady(self, layout: Layout) -> bool:
        return bool(self.need_bytes[LAYOUTS.index(layout)] <= self.budget_bytes)

    def time_s(self, layout: Layout) -> float:
        return float(self.estimates.total_s[LAYOUTS.index(layout)])

    @functools.cached_property
    def reason(self) -> str:
        cur, chosen = self.current, self.layout
        if self.action == HOLD:
            return f"hold admission: {self.note}"
        if self.action == FORCED:
            return (f"forced switch {cur} -> {chosen}: {cur} no longer fits (Eq 6: "
                    f"{self._gib(cur)} of {self.budget_bytes / GIB:.2f} GiB); {chosen} is the fastest "
                    f"whose switch fits (Eq 5)")
        if self.action == SWITCH:
            return (f"switch {cur} -> {chosen}: {chosen} is {self._lead(chosen):.1%} faster than {cur} "
                    f"(margin {self.margin:.0%}) and the switch fits (Eq 5)")
        return f"stay in {cur}: {self.note}"

    def layout_rows(self) -> list[dict]:
        """Per layout: predicted step time, memory, Eq 6 and Eq 5 verdicts."""
        rows = []
        for i, layout in enumerate(LAYOUTS):
            check = self.switch_checks.get(layout)
            step = self.estimates.step_time(layout)
            rows.append({
                "layout": layout, "time_s": step.total_s, "vs_current": self._lead(layout),
                "need_gib": float(self.need_bytes[i]) / GIB, "fits_eq6": self.fits_steady(layout),
                "switch_eq5": None if check is None else check.fits,
                "switch_peak_gib": None if check is None else check.peak_bytes / GIB,
                "eq5_how": None if check is None else check.how,
                "proj_s": step.proj_s, "att_s": step.att_s, "latency_s": step.latency_s,
                "exposed_comm_s": step.exposed_comm_s, "host_s": step.host_s, "ffn_s": step.ffn_s,
                "bounds": dict(step.bounds), "waves": self.waves(layout),
                "pool_tokens": None if self.pool_tokens is None else float(self.pool_tokens[i]),
            })
        return rows

    def explain(self) -> str:
        lines = [self.reason, f"  the batch reserves {self.demand_tokens:,.0f} distinct tokens of KV"]
        for r in self.layout_rows():
            eq5 = "" if r["switch_eq5"] is None else (
                f"; switch {'fits' if r['switch_eq5'] else 'exceeds'} Eq 5 at {r['switch_peak_gib']:.2f} GiB "
                f"({r['eq5_how']})")
            pool = "" if r["pool_tokens"] is None else f"  pool {r['pool_tokens']:,.0f} tokens, {_waves(r['waves'])}"
            lines.append(f"  {r['layout']!s:<4} {r['time_s'] * 1e3:9.3f} ms ({percent(-r['vs_current'], signed=True)} vs {self.current})  "
                         f"{r['need_gib']:8.2f} GiB  Eq 6 {'fits' if r['fits_eq6'] else 'exceeds'}{eq5}{pool}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"action": self.action, "layout": self.layout, "current": self.current, "reason": self.reason,
                "budget_gib": self.budget_bytes / GIB, "margin": self.margin, "demand_tokens": self.demand_tokens,
                "layouts": self.layout_rows()}

    def _lead(self, layout: Layout) -> float:
        """How much faster ``layout`` is than the current one (fraction of the current's time)."""
        cur = self.time_s(self.current)
        return (cur - self.time_s(layout)) / cur if cur > 0 else 0.0

    def _gib(self, layout: Layout) -> str:
        return f"{float(self.need_bytes[LAYOUTS.index(layout)]) / GIB:.2f} GiB needed"


def _waves(waves: int | None) -> str:
    return "holds nothing" if waves is None else "admits the batch at once" if waves == 1 else f"{waves} waves"


class Scheduler:
    """π(x; θ) for one deployment. :meth:`decide` is pure; :meth:`step` also remembers the
    layout and the steps since the last switch, as an engine calling it every step needs."""

    def __init__(self, deployment, cost_model: CostModel | None = None):
        self.deployment = deployment
        self.cost = cost_model or CostModel.from_deployment(deployment)
        cfg = deployment.scheduler
        self.margin, self.min_steps = cfg.margin, cfg.min_steps_between_switches
        self.budget = deployment.memory_budget_bytes
        self.fixed = deployment.common_bytes + deployment.reserve_bytes  # M0 + R of Eq 5/6
        self.layers = None if deployment.layers is None else tuple(range(deployment.layers))
        self.current = deployment.initial_layout
        self.steps_since_switch = math.inf

    def decide(self, x: BatchArrays, current: Layout, steps_since_switch: float = math.inf) -> Decision:
        est = self.cost.evaluate(x)
        need = est.memory_bytes.max(axis=1) + self.fixed
        fits = need <= self.budget
        times = est.total_s
        order = [LAYOUTS[i] for i in np.argsort(times, kind="stable") if fits[i]]
        ci = LAYOUTS.index(current)
        checks: dict[Layout, SwitchCheck] = {}
        make = functools.partial(Decision, estimates=est, need_bytes=need, budget_bytes=self.budget,
                                 margin=self.margin, switch_checks=checks, current=current,
                                 pool_tokens=self.pool_tokens(est), demand_tokens=float(x.reserved.sum()))
        if not fits[ci]:
            for cand in order:
                checks[cand] = self._eq5(current, cand, x, est)
                if checks[cand].fits:
                    return make(action=FORCED, layout=cand)
            if not order:
                detail = ", ".join(f"{l} needs {need[i] / GIB:.2f} GiB" for i, l in enumerate(LAYOUTS))
                return make(action=HOLD, layout=current,
                            note=f"no layout fits the batch in {self.budget / GIB:.2f} GiB per rank ({detail})")
            return make(action=HOLD, layout=current,
                        note=f"{current} no longer fits and no switch into {', '.join(map(str, order))} fits Eq 5")
        best = order[0]
        if self.cost.T == 1 and best is not current:
            # one rank holds the same weights and KV in every layout and does the same arithmetic:
            # the layouts' times differ only by host overheads measured at other group sizes, and a
            # switch would only cost (a new set of decode graphs)
            return make(action=STAY, layout=current, note=f"one rank: every layout computes the same step "
                                                          f"({best} predicted {percent(self._lead(times, ci, best))} faster)")
        if best is current:
            runner = next((l for l in order if l is not current), None)
            tail = f" ({runner} next, {percent(-self._lead(times, ci, runner), signed=True)})" if runner else ""
            return make(action=STAY, layout=current, note=f"fastest feasible layout{tail}")
        if steps_since_switch < self.min_steps:
            return make(action=STAY, layout=current,
                        note=f"{best} leads, but the last switch was {steps_since_switch} steps ago "
                             f"(minimum {self.min_steps})")
        refused = []
        for cand in order:
            if cand is current or self._lead(times, ci, cand) < self.margin:
                break  # sorted by time: every later candidate leads by less
            checks[cand] = self._eq5(current, cand, x, est)
            if checks[cand].fits:
                return make(action=SWITCH, layout=cand)
            refused.append(str(cand))
        if refused:
            return make(action=STAY, layout=current,
                        note=f"{', '.join(refused)} lead by the margin but the switch would exceed memory (Eq 5)")
        return make(action=STAY, layout=current,
                    note=f"{best} leads by only {self._lead(times, ci, best):.1%}, under the {self.margin:.0%} margin")

    def pool_tokens(self, est: Estimates) -> np.ndarray:
        """Per layout, the distinct tokens its KV pool holds over the group (Eq 6: the budget
        less M0, R, the layout's weights and this step's activations, at k bytes per token);
        TP's ranks each hold every token, the others 1/T of them."""
        per_rank = self.budget - self.fixed - self.cost.weights_bytes - est.scratch_bytes.max(axis=1)
        tokens = np.maximum(per_rank, 0.0) / max(self.cost.kv_bytes_token, 1e-30)
        replicated = np.array([l.ownership is Ownership.ALL for l in LAYOUTS])
        return np.where(replicated, tokens, tokens * self.cost.T)

    def switch_cost(self, decision: Decision, x: BatchArrays) -> SwitchCost | None:
        """Eq 7 of the switch ``decision`` makes for batch ``x`` (None when it stays): the exposed
        transfer, layer i−1 computing in the destination, plus the re-capture of decode graphs
        where the switch moves weights (planned here when Eq 5 did not plan it)."""
        if not decision.switch:
            return None
        manifest = decision.manifest or plan_switch(decision.current, decision.layout, x.history_batch(),
                                                    self.cost.model, self.cost.T, self.cost.page_size, layers=self.layers)
        return switch_cost(manifest, self.cost, decision.estimates.step_time(decision.layout), x)

    def explain_switch_cost(self, decision: Decision, cost: SwitchCost, x: BatchArrays) -> str:
        """Eq 7 of ``cost`` in words: the exposed transfer and the re-capture term, and why the
        re-capture is charged or not."""
        src, dst, graphs = decision.current, decision.layout, self.cost.graph_costs
        head = (f"switch cost (Eq 7): {cost.exposed_s * 1e3:.3f} ms exposed = transfer "
                f"{cost.transfer_exposed_s * 1e3:.3f} ms + re-capture {cost.recapture_s * 1e3:.3f} ms; ")
        if graphs is None:
            why = ("no re-capture: decode graphs are off" if self.deployment.graphs.mode == "off" else
                   "no re-capture: this model's decode steps run eagerly (KDA layers or sparse attention)"
                   if not self.cost.decode_capturable else
                   f"no re-capture: hardware profile {self.cost.hardware.name} says its backend captures no graphs")
        elif not moves_weights(src, dst, self.cost.T):
            why = f"no re-capture: {src} -> {dst} keeps the weights, so the graphs of both stay valid"
        elif graphs.bucket(x) is None:
            why = (f"no re-capture now: {src} -> {dst} moves the weights, but the batch exceeds the largest bucket "
                   f"({graphs.buckets[-1]} rows per owner) and decodes eagerly; each bucket is captured when first used")
        else:
            why = (f"{src} -> {dst} moves the weights, so the first decode step captures {dst}'s graph of bucket "
                   f"{graphs.bucket(x)} ({graphs.layers} layers x {graphs.capture_s_per_layer * 1e3:.2f} ms); "
                   f"other buckets are captured when first used")
        return head + why

    def step(self, x: BatchArrays) -> Decision:
        """Decide for this step and remember the outcome."""
        decision = self.decide(x, self.current, self.steps_since_switch)
        if decision.switch:
            self.current, self.steps_since_switch = decision.layout, 0
        else:
            self.steps_since_switch += 1
        return decision

    @staticmethod
    def _lead(times, ci: int, layout: Layout) -> float:
        cur = float(times[ci])
        return (cur - float(times[LAYOUTS.index(layout)])) / cur if cur > 0 else 0.0

    def _eq5(self, src: Layout, dst: Layout, x: BatchArrays, est: Estimates) -> SwitchCheck:
        """Eq 5: max(M_r(a), M_r(b)) + Δ_layer_r + R_r ≤ H_r, with M0 and scratch counted.

        Memory at the reserved lengths bounds M from above (the switch itself moves only the
        live context); one layer of both layouts' state bounds Δ_layer from above (a rank
        receives at most what it will hold and sends at most what it holds). With one layer
        kind the layer-by-layer sweep never exceeds Eq 5, so the upper bound settles a fit;
        a sure overflow is settled by max(M_a, M_b) alone; anything else is planned."""
        a, b = LAYOUTS.index(src), LAYOUTS.index(dst)
        mem = est.memory_bytes
        base = np.maximum(mem[a], mem[b]) + self.fixed
        layer_state = (mem[a] + mem[b]) / max(1, sum(kc.layers for kc in self.cost.kinds))
        if len(self.cost.kinds) == 1:
            upper = base + layer_state
            if upper.max() <= self.budget:
                return SwitchCheck(True, "bound", float(upper.max()))
        if base.max() > self.budget and bool((x.reserved == x.contexts).all()):
            return SwitchCheck(False, "bound", float(base.max()))
        histories = x.history_batch()
        manifest = plan_switch(src, dst, histories, self.cost.model, self.cost.T, self.cost.page_size,
                               layers=self.layers)
        scratch = float(np.maximum(est.scratch_bytes[a], est.scratch_bytes[b]).max())
        fit = manifest.fits(self.budget - self.deployment.common_bytes - scratch, self.deployment.reserve_bytes)
        peak = float(fit.peak_bytes.max()) + self.deployment.common_bytes + scratch
        return SwitchCheck(fit.fits, "planned", peak, manifest, histories)
