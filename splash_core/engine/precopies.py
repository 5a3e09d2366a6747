"""Switches as pre-copies in the step loop (``--switch-mode precopy`` or ``auto``;
:mod:`splash_core.runtime.switch.precopy`).

Every rank keeps the same pre-copy state and takes the same decision each step, from rank 0's
plan alone: when the plan names a layout other than the current one, a pre-copy to it begins
(copying over ``steps`` steps, which run in the current layout; with ``auto``, over the plan's
``precopy_steps``, and a plan with none switches in one step), and the first step after it
completed hands off (the switching step, moving only the dirty tails). When the plan names the
current layout again, or another one, the pre-copy is cancelled (its copies freed). A pre-copy
that its steps did not complete (memory was short: it paused) hands off what it copied, the
layers it did not copy moving whole in the handoff; having copied no layer, it falls back to the
one-step switch, and so does a handoff that Eq 5 or the pools refuse (the copies count as held); a one-step
switch refused too runs the step in the current layout, as a refused switch does, and the
plan's next step begins a new pre-copy. A plan whose ``precopy_steps`` is :data:`AT_ONCE` switches
in one step even where every switch is a pre-copy (the controller's, when the current layout
cannot hold the running requests: steps beside a pre-copy would run there). A failed copy cancels the pre-copy
(the step it ran beside is unaffected), and so does a step whose new pages need the room the
copies hold; the next step begins a new one.
"""

from __future__ import annotations

import dataclasses

from ..runtime.switch import Mode, SwitchRefused
from .plan import StepPlan

HANDOFF_MODE = Mode.SPLASH  # the handoff is an ordinary layer-pipelined switching step
COPYING, HANDED_OFF, CANCELLED, FELL_BACK = "copying", "handed_off", "cancelled", "fell_back"
OUTCOMES = (HANDED_OFF, CANCELLED, FELL_BACK)
AT_ONCE = -1  # a plan's precopy_steps: switch in this step, without a pre-copy, whatever the mode


@dataclasses.dataclass
class PreCopyRecord:
    """One pre-copy the step loop began, as it went (the same on every rank but ``host_ms``):
    how it ended (``outcome``: still ``copying``, ``handed_off``, ``cancelled``, or ``fell_back``
    to the one-step switch) and ``why`` where it did not hand off."""

    begun: int  # the step it began in
    src: str
    dst: str
    steps: int  # the steps it was to copy over
    steps_run: int = 0  # steps it ran beside
    paused_steps: int = 0  # of those, steps that copied nothing (memory was short)
    layers: int = 0  # layers whose prefixes landed
    uncopied: int = 0  # layers it had not copied when it handed off (they moved whole in the handoff)
    bytes: int = 0  # received in the background, summed over the group
    host_ms: float = 0.0  # this rank's host time on the copies
    outcome: str = COPYING
    why: str = ""
    ended: int | None = None  # the step it was handed off, cancelled or fell back in
    paused: str = ""  # why its last paused step copied nothing

    def end(self, step: int, outcome: str, why: str = "") -> None:
        self.ended, self.outcome, self.why = step, outcome, why

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class PreCopies:
    """The step loop's pre-copy on one rank (``executor``: the group's switch executor). Every
    pre-copy begun is booked in a :class:`PreCopyRecord`; ``events`` are the records that began or
    ended in the last step run."""

    def __init__(self, executor, steps: int, forced: bool = True):
        """``steps``: every switch pre-copies over that many steps where ``forced``, else over
        each plan's ``precopy_steps`` (the policy's choice, 0 for one step)."""
        if steps < 1:
            raise ValueError(f"a pre-copy spans at least one step (got precopy_steps = {steps})")
        self.executor, self.steps, self.forced, self.active = executor, steps, forced, None
        self.mode = HANDOFF_MODE
        self.record: PreCopyRecord | None = None  # the active pre-copy's
        self.events: list[PreCopyRecord] = []

    def release(self, request: int) -> None:
        """A finished request's copies go with its pages."""
        if self.active is not None:
            self.active.release(request)

    def run(self, plan: StepPlan, tokens, share):
        """Run ``plan``'s step: (logits, switch report or None, why a switch was refused or "",
        whether the step ran beside a pre-copy). ``share(precopy)``: rank 0's plan of the switching
        step (handing off ``precopy``, or the one-step switch for None), as every rank gets it."""
        model = self.executor.model
        batch = plan.batch(model.T, model.page_size)
        dst, active, current = plan.layout, self.active, model.layers[0].layout
        self.events = []
        if active is not None and (dst is not active.dst or dst is current):
            active.cancel()
            self._end(plan.step, CANCELLED, f"step {plan.step}'s plan names {dst}, not {active.dst}")
            active = self.active = None
        if dst is current:
            return model.step(batch, tokens), None, "", False
        if active is None:
            steps = self.steps if self.forced else plan.precopy_steps
            if steps and plan.precopy_steps != AT_ONCE:
                active = self.active = self.executor.precopy(dst, batch, steps)
                self.record = PreCopyRecord(plan.step, str(current), str(dst), steps)
                self.events.append(self.record)
        if active is not None and not active.complete and not active.due:
            logits, report = active.step(batch, tokens)
            self._book(report)
            if active.cancelled:  # a copy failed, or the step needed the copies' pages
                self._end(plan.step, CANCELLED, report.failed or report.cancelled)
                self.active = None
            return logits, None, "", True
        fallback = ""
        if active is not None and not active.complete and not active.holding:  # paused throughout: one step
            fallback = (f"{len(active.pending)} layers not copied after {active.steps_run} steps"
                        + (f" ({self.record.paused})" if self.record.paused else ""))
            active.cancel()
            active = None
        self.active = None
        try:
            logits, report = self._switch(batch, tokens, dst, share, active, plan.step, fallback)
        except SwitchRefused as exc:
            return model.step(batch, tokens), None, str(exc), False
        return logits, report, "", False

    def close(self, step: int) -> None:
        """The run stops before ``step``: a pre-copy still running is cancelled (its copies freed)."""
        if self.active is not None:
            self.active.cancel()
            self.active = None
            self._end(step, CANCELLED, "the run ended first")

    def _book(self, report) -> None:
        r = self.record
        r.steps_run, r.layers, r.bytes = report.step, r.layers + len(report.layers), r.bytes + report.group_bytes
        r.host_ms += report.host_ms
        if report.paused:
            r.paused_steps, r.paused = r.paused_steps + 1, report.paused

    def _end(self, step: int, outcome: str, why: str = "") -> None:
        """The active pre-copy's record ends (a fall back ends once: at the first refusal)."""
        if self.record is not None and self.record.outcome == COPYING:
            self.record.end(step, outcome, why)
            if self.record not in self.events:
                self.events.append(self.record)
        if outcome != FELL_BACK:
            self.record = None

    def _switch(self, batch, tokens, dst, share, precopy, step: int, fallback: str):
        """The switching step handing off ``precopy`` (or in one step, for None, after the active
        record fell back for ``fallback`` if any); a handoff that Eq 5 or the pools refuse (the
        copies count as held) falls back to the one-step switch."""
        if precopy is None and fallback:
            self._end(step, FELL_BACK, fallback)
        try:
            logits, report = self.executor.step(batch, tokens, dst, HANDOFF_MODE, plan=share(precopy),
                                                 precopy=precopy)
        except SwitchRefused as exc:
            if precopy is None:
                self.record = None
                raise
            precopy.cancel()
            return self._switch(batch, tokens, dst, share, None, step, f"the handoff was refused: {exc}")
        except BaseException as exc:
            if precopy is not None:
                precopy.cancel()
                self._end(step, CANCELLED, f"the handoff failed: {type(exc).__name__}: {exc}")
            self.record = None
            raise
        if precopy is not None:
            self.record.uncopied = len(precopy.pending)
            self._end(step, HANDED_OFF)
        self.record = None
        return logits, report
