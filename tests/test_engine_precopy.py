"""The engine with ``switch_mode="precopy"`` and ``"auto"`` on T = 2 gloo ranks: forced switches
through all 12 directions as pre-copies then handoffs, a policy that changes its mind before every
pre-copy completes (each is cancelled, nothing switches), plans that say per switch whether to
pre-copy (auto), the scheduler's explained choice, a refused handoff falling back to the one-step
switch, and the CLI's option checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from splash_core.cli.main import main
from splash_core.engine import Job, serve
from splash_core.engine.policy import ScriptedPolicy
from splash_core.layouts import Layout
from splash_core.profiles import load
from splash_core.profiles.loader import builtin_root

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP
ALL_DIRECTIONS = (TP, DP, TP, CP, TP, DOP, DP, CP, DP, DOP, CP, DOP, TP)


def test_forced_precopy_switches_through_every_direction_lose_no_request(rank_pools):
    """Each layout for 4 steps: the plan names a new layout, 2 steps copy beside it, the third
    hands off; the switch is booked at the handoff (2 steps after the plan asked for it)."""
    job = Job("cpu-tiny", "rollout-tiny", policy=ScriptedPolicy(ALL_DIRECTIONS, every=4), prefill_chunk=32,
              switch_mode="precopy", precopy_steps=2)
    summary = rank_pools(2).run(serve, job)[0]
    done = [s for s in summary.switches if not s.refused]
    assert not [s for s in summary.switches if s.refused]
    # the script wraps around after its 13 layouts; each switch comes 2 steps after its layout's turn began
    assert [(s.src, s.dst) for s in done[:12]] == [(str(a), str(b)) for a, b in zip(ALL_DIRECTIONS, ALL_DIRECTIONS[1:])]
    assert all(s.step % 4 == 2 for s in done), [s.step for s in done]
    specs = load("workload", "rollout-tiny").requests()
    assert summary.served == len(specs) and summary.output_tokens == sum(s.max_new_tokens for s in specs)
    assert summary.check["passed"] and summary.check["tokens"] == summary.output_tokens


def test_precopy_beside_static_decode_steps(rank_pools):
    """With ``graphs: {mode: static}`` every decode step runs from the persistent buffers and the
    device block tables (what a GPU replays as a graph): the copies, held under ids of their own,
    never enter those tables, and as they join their requests at the handoff the tables follow."""
    deployment = yaml.safe_load((builtin_root() / "deployments" / "cpu-tiny.yaml").read_text())
    deployment["graphs"] = {"mode": "static"}
    job = Job(deployment, "rollout-tiny", policy=ScriptedPolicy(ALL_DIRECTIONS, every=4), switch_mode="precopy",
              precopy_steps=2)
    summary = rank_pools(2).run(serve, job)[0]
    assert len({(s.src, s.dst) for s in summary.switches if not s.refused}) == 12
    assert summary.check["passed"] and summary.check["tokens"] == summary.output_tokens


def test_a_policy_that_changes_its_mind_cancels_every_precopy(rank_pools):
    """DP and TP in turn, one step each, with pre-copies of 3 steps: every TP step begins a
    pre-copy, the next DP step cancels it; nothing ever switches and every token is the reference's."""
    job = Job("cpu-tiny", "rollout-tiny", policy=ScriptedPolicy((DP, TP), every=1), switch_mode="precopy",
              precopy_steps=3)
    summary = rank_pools(2).run(serve, job)[0]
    assert summary.switches == () and set(summary.layout_steps) == {"DP"}
    assert summary.check["passed"] and summary.check["tokens"] == summary.output_tokens


@pytest.mark.parametrize("args, message", [
    (["--precopy-steps", "0"], "argument --precopy-steps: must be >= 1 (got 0)"),
    (["--switch-mode", "later"], "argument --switch-mode: invalid choice: 'later'"),
])
def test_bad_precopy_options_are_one_line_and_exit_code_2(capsys, args, message):
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("splash run: error: ") and message in err


class _AlternatingPrecopies(ScriptedPolicy):
    """The script's layouts, switching into every second one by a pre-copy of 2 steps and into the
    others in one step (what the scheduler's choice under ``switch_mode="auto"`` looks like)."""

    def decide(self, x, current, steps_since_switch, step):
        choice = super().decide(x, current, steps_since_switch, step)
        turn = (step // self.every) % len(self.script)
        return dataclasses.replace(choice, precopy_steps=2 * (turn % 2))


def test_auto_mode_switches_as_each_plan_says(rank_pools):
    job = Job("cpu-tiny", "rollout-tiny", policy=_AlternatingPrecopies(ALL_DIRECTIONS, every=4), prefill_chunk=32,
              switch_mode="auto", precopy_steps=8)
    summary = rank_pools(2).run(serve, job)[0]
    done = [s for s in summary.switches if not s.refused]
    assert len(done) >= 12 and not [s for s in summary.switches if s.refused]
    # into odd turns of the script by a pre-copy of 2 steps (booked at its handoff), else at once
    turns = len(ALL_DIRECTIONS)
    assert all(s.step % 4 == (2 if (s.step // 4) % turns % 2 else 0) for s in done), [s.step for s in done]
    assert summary.check["passed"] and summary.check["tokens"] == summary.output_tokens


def test_the_scheduler_explains_its_choice_in_auto_mode(rank_pools):
    """The default job's one switch (TP to DP: its KV is only discarded, so nothing to pre-copy):
    the scheduler costs both ways and switches in one step."""
    summary = rank_pools(2).run(serve, Job("cpu-tiny", "rollout-tiny", switch_mode="auto"))[0]
    assert [(s.src, s.dst) for s in summary.switches] == [("TP", "DP")]
    assert "one-step switch:" in summary.switches[0].reason and "exposed (Eq 7)" in summary.switches[0].reason
    assert summary.check["passed"]


class _FakePreCopy:
    def __init__(self, dst):
        self.dst, self.complete, self.due, self.cancelled = dst, True, False, False

    def cancel(self):
        self.cancelled = True


class _FakeExecutor:
    """Refuses every handoff of a pre-copy (its copies held push Eq 5 over), takes the one-step switch."""

    def __init__(self):
        from types import SimpleNamespace

        self.model = SimpleNamespace(T=2, page_size=16, layers=[SimpleNamespace(layout=DP)],
                                     step=lambda batch, tokens: "ran in DP")
        self.calls, self.made = [], []

    def precopy(self, dst, batch, steps):
        self.made.append(_FakePreCopy(dst))
        return self.made[-1]

    def step(self, batch, tokens, dst, mode, *, plan, precopy):
        from splash_core.runtime.switch import SwitchRefused

        self.calls.append((plan, precopy is not None))
        if precopy is not None:
            raise SwitchRefused("Eq 5: over budget with the copies held")
        return "switched", "report"


def test_a_refused_handoff_falls_back_to_the_one_step_switch():
    from splash_core.engine.plan import Command, StepPlan
    from splash_core.engine.precopies import PreCopies
    from splash_core.runtime.step_batch import StepRequest

    executor = _FakeExecutor()
    plan = StepPlan(Command.STEP, 0, TP, (StepRequest(0, 0, 5, 1),), np.zeros(1, np.int64))
    out = PreCopies(executor, 2).run(plan, None, lambda pc: "handoff plan" if pc is not None else "one-step plan")
    assert out == ("switched", "report", "", False)
    assert executor.calls == [("handoff plan", True), ("one-step plan", False)]
    assert executor.made[0].cancelled  # its copies were freed before the one-step switch
