"""Who picks the layout of each step (rank 0): the scheduler, a fixed layout, or a script.

A policy sees the step's batch as the scheduler does (:class:`~splash_core.planning.costmodel.BatchArrays`:
contexts including this step's rows, query rows, owners, reserved lengths) and returns a
:class:`Choice`. ``layouts`` lists every layout it may run, fastest-first where it knows
(the engine falls back along it when the choice does not fit the KV pool).

Policies are built on rank 0 from a spec string (``splash``, ``TP``, ``CP``, ``DP``, ``DOP``,
or ``script:TP,DP,CP:3`` — the listed layouts in turn, each for 3 steps) or passed as objects.
"""

from __future__ import annotations

import dataclasses

from ..layouts import LAYOUTS, Layout
from ..planning.costmodel import BatchArrays
from ..planning.precopy_time import TransitionCost, plan_transition
from ..planning.scheduler import HOLD, Scheduler, SwitchCheck


@dataclasses.dataclass(frozen=True)
class Choice:
    """One step's layout, and whether to hold admission before the next step. ``switch``: the
    scheduler's Eq 5 check of the switch into ``layout`` (with the manifest it planned, if it
    planned one), which the switch executor takes instead of planning and checking it again.
    ``precopy_steps``: switch by a pre-copy of that many steps (0: in one step)."""

    layout: Layout
    action: str  # the scheduler's stay / switch / forced_switch / hold_admission, or fixed / scripted
    reason: str
    preference: tuple[Layout, ...]  # every layout the policy may run, most preferred first
    hold: bool = False
    switch: SwitchCheck | None = None
    precopy_steps: int = 0


@dataclasses.dataclass(frozen=True)
class _PlannedPreCopy:
    """A pre-copy the policy chose at step ``planned`` for ``src → dst``; it hands off by step
    ``planned + best.steps``."""

    src: Layout
    dst: Layout
    best: TransitionCost
    planned: int

    def covers(self, src: Layout, dst: Layout, step: int) -> bool:
        return self.src is src and self.dst is dst and step <= self.planned + self.best.steps


class SchedulerPolicy:
    """SPLASH: the transition-aware scheduler π(x; θ) (paper §4.2) decides every step; with
    ``precopy_steps``, each switch it decides is made in one step or as a pre-copy of up to that
    many steps, whichever Eq 7 extended (:mod:`splash_core.planning.precopy_time`) finds cheaper.

    The scheduler keeps asking for the switch on every step of the pre-copy it chose; those steps
    run beside that pre-copy whatever the plan's ``precopy_steps`` say, so until its handoff step
    the policy keeps its choice instead of planning the transition again (a new destination, or
    a new source after the switch, plans afresh)."""

    name = "splash"
    layouts = LAYOUTS

    def __init__(self, deployment, precopy_steps: int = 0):
        self.scheduler = Scheduler(deployment)
        self.initial = deployment.initial_layout
        self.precopy_steps, self.interference = precopy_steps, deployment.scheduler.precopy_interference
        self._planned: _PlannedPreCopy | None = None

    def decide(self, x: BatchArrays, current: Layout, steps_since_switch: float, step: int) -> Choice:
        d = self.scheduler.decide(x, current, steps_since_switch)
        order = tuple(sorted(LAYOUTS, key=d.time_s))
        check = d.switch_checks.get(d.layout) if d.switch else None
        reason, steps = d.reason, 0
        if d.switch and self.precopy_steps:
            planned = self._planned
            if planned is not None and planned.covers(current, d.layout, step):
                best, when = planned.best, f" (chosen at step {planned.planned})"
            else:
                s = self.scheduler
                best, _ = plan_transition(x, current, d.layout, s.cost, d.estimates, self.precopy_steps,
                                          self.interference, layers=s.layers)
                self._planned = _PlannedPreCopy(current, d.layout, best, step) if best.steps else None
                when = ""
            reason, steps = f"{reason}; {best.explain()}{when}", best.steps
        return Choice(d.layout, d.action, reason, order, hold=d.action == HOLD,
                      switch=check, precopy_steps=steps)


@dataclasses.dataclass(frozen=True)
class FixedPolicy:
    """One layout for the whole run (the paper's fixed-layout protocol)."""

    layout: Layout

    @property
    def name(self) -> str:
        return str(self.layout)

    @property
    def layouts(self) -> tuple[Layout, ...]:
        return (self.layout,)

    @property
    def initial(self) -> Layout:
        return self.layout

    def decide(self, x, current, steps_since_switch, step) -> Choice:
        return Choice(self.layout, "fixed", f"fixed layout {self.layout}", (self.layout,))


@dataclasses.dataclass(frozen=True)
class ScriptedPolicy:
    """The listed layouts in turn, ``every`` steps each (forced switches, for tests and demos)."""

    script: tuple[Layout, ...]
    every: int = 1

    def __post_init__(self):
        if not self.script or self.every < 1:
            raise ValueError("a script needs at least one layout and every >= 1")

    @property
    def name(self) -> str:
        return f"script:{','.join(map(str, self.script))}:{self.every}"

    @property
    def layouts(self) -> tuple[Layout, ...]:
        return tuple(dict.fromkeys(self.script))

    @property
    def initial(self) -> Layout:
        return self.script[0]

    def decide(self, x, current, steps_since_switch, step) -> Choice:
        layout = self.script[(step // self.every) % len(self.script)]
        rest = tuple(l for l in self.layouts if l is not layout)
        return Choice(layout, "scripted", f"script step {step}: {layout}", (layout,) + rest)


def make_policy(spec, deployment, precopy_steps: int = 0):
    """A policy from a spec string (see the module docstring) or an object that is one already;
    ``precopy_steps``: the scheduler may switch by pre-copies of up to that many steps."""
    if not isinstance(spec, str):
        return spec
    text = spec.strip()
    if text.lower() == "splash":
        return SchedulerPolicy(deployment, precopy_steps)
    if text.lower().startswith("script:"):
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[1]:
            raise ValueError(f"policy {spec!r}: expected script:LAYOUT,LAYOUT,...[:STEPS]")
        steps = parts[2].strip() if len(parts) == 3 else "1"
        if not steps.isdigit() or int(steps) < 1:
            raise ValueError(f"policy {spec!r}: STEPS (steps per layout) must be a whole number >= 1 (got {steps!r})")
        try:
            layouts = tuple(Layout.parse(p) for p in parts[1].split(","))
        except ValueError as exc:
            raise ValueError(f"policy {spec!r}: {exc}") from None
        return ScriptedPolicy(layouts, int(steps))
    try:
        return FixedPolicy(Layout.parse(text))
    except ValueError:
        raise ValueError(f"unknown policy {spec!r}: expected splash, one of "
                         f"{', '.join(map(str, LAYOUTS))}, or script:LAYOUT,...[:STEPS]") from None


