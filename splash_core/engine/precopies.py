"""Switches as pre-copies in the step loop (``--switch-mode precopy`` or ``auto``;
:mod:`splash_core.runtime.switch.precopy`).

Every rank keeps the same pre-copy state and takes the same decision each step, from rank 0's
plan alone: when the plan names a layout other than the current one, a pre-copy to it begins
(copying over ``steps`` steps, which run in the current layout; with ``auto``, over the plan's
``precopy_steps``, and a plan with none switches in one step), and the first step after it
completed hands off (the switching step, moving only the dirty tails). When the plan names the
current layout again, or another one, the pre-copy is cancelled (its copies freed). A pre-copy
that its steps did not complete (memory was short: it paused) falls back to the one-step switch,
and so does a handoff that Eq 5 or the pools refuse (the copies count as held); a one-step
switch refused too runs the step in the current layout, as a refused switch does, and the
plan's next step begins a new pre-copy. A failed copy cancels the pre-copy
(the step it ran beside is unaffected), and so does a step whose new pages need the room the
copies hold; the next step begins a new one.
"""

from __future__ import annotations

from ..runtime.switch import Mode, SwitchRefused
from .plan import StepPlan

HANDOFF_MODE = Mode.SPLASH  # the handoff is an ordinary layer-pipelined switching step


class PreCopies:
    """The step loop's pre-copy on one rank (``executor``: the group's switch executor)."""

    def __init__(self, executor, steps: int, forced: bool = True):
        """``steps``: every switch pre-copies over that many steps where ``forced``, else over
        each plan's ``precopy_steps`` (the policy's choice, 0 for one step)."""
        if steps < 1:
            raise ValueError(f"a pre-copy spans at least one step (got precopy_steps = {steps})")
        self.executor, self.steps, self.forced, self.active = executor, steps, forced, None
        self.mode = HANDOFF_MODE

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
        dst, active = plan.layout, self.active
        if active is not None and (dst is not active.dst or dst is model.layers[0].layout):
            active.cancel()
            active = self.active = None
        if dst is model.layers[0].layout:
            return model.step(batch, tokens), None, "", False
        if active is None:
            steps = self.steps if self.forced else plan.precopy_steps
            if steps:
                active = self.active = self.executor.precopy(dst, batch, steps)
        if active is not None and not active.complete and not active.due:
            logits, _ = active.step(batch, tokens)
            if active.cancelled:  # a copy failed, or the step needed the copies' pages
                self.active = None
            return logits, None, "", True
        if active is not None and not active.complete:  # paused too long: the one-step switch instead
            active.cancel()
            active = None
        self.active = None
        try:
            logits, report = self._switch(batch, tokens, dst, share, active)
        except SwitchRefused as exc:
            return model.step(batch, tokens), None, str(exc), False
        return logits, report, "", False

    def _switch(self, batch, tokens, dst, share, precopy):
        """The switching step handing off ``precopy`` (or in one step, for None); a handoff that
        Eq 5 or the pools refuse (the copies count as held) falls back to the one-step switch."""
        try:
            return self.executor.step(batch, tokens, dst, HANDOFF_MODE, plan=share(precopy), precopy=precopy)
        except SwitchRefused:
            if precopy is None:
                raise
            precopy.cancel()
            return self._switch(batch, tokens, dst, share, None)
        except BaseException:
            if precopy is not None:
                precopy.cancel()
            raise
