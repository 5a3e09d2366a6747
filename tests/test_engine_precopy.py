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
from splash_core.engine.summary import render
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
    # the summary books each switch as the handoff of its pre-copy: begun 2 steps before, copied over 2
    for s in done:
        p = s.precopy
        assert s.kind == "precopy" and p["outcome"] == "handed_off" and not p["why"], s
        assert (p["begun"], p["ended"], p["steps"], p["steps_run"], p["src"], p["dst"]) == \
            (s.step - 2, s.step, 2, 2, s.src, s.dst), p
        assert p["paused_steps"] == 0 and p["layers"] == done[0].precopy["layers"] > 0  # every MLA layer once
    # TP -> DP and TP -> DOP only discard KV: nothing to pre-copy; DP -> TP gathers every history ahead
    kv_ahead = {(s.src, s.dst): s.precopy["bytes"] for s in done}
    assert kv_ahead[("TP", "DP")] == kv_ahead[("TP", "DOP")] == 0 and kv_ahead[("DP", "TP")] > 0, kv_ahead
    # the last one begun may have found every request done before its handoff
    late = [p for p in summary.precopies if p["outcome"] != "handed_off"]
    assert len(late) <= 1 and all(p["outcome"] == "cancelled" and p["why"] == "the run ended first" and
                                  p["ended"] == summary.steps for p in late), late
    assert summary.precopy_counts == {"begun": len(done) + len(late), "handed_off": len(done),
                                      "cancelled": len(late), "fell_back": 0}
    assert [p["begun"] for p in summary.precopies if not p["why"]] == [s.step - 2 for s in done]
    out = summary.as_dict()
    assert out["precopy_counts"] == summary.precopy_counts and len(out["precopies"]) == len(done) + len(late)
    assert {d["kind"] for d in out["switches"]} == {"precopy"} and out["switches"][0]["precopy"]["steps"] == 2
    text = render(summary)
    assert (f"{len(done) + len(late)} begun: {len(done)} handed off, {len(late)} cancelled, 0 fell back to one step"
            in text)
    assert "pre-copy 2/2 steps" in text


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
    # every TP step began one; the next step's plan named DP again and cancelled it after one copying step
    begun = summary.precopy_counts["begun"]
    assert begun > 1 and summary.precopy_counts == {"begun": begun, "handed_off": 0, "cancelled": begun,
                                                     "fell_back": 0}
    for p in summary.precopies:
        assert p["begun"] % 2 == 1 and p["ended"] == p["begun"] + 1 and p["steps_run"] == 1, p
        ended = "the run ended first" if p["ended"] == summary.steps else f"step {p['ended']}'s plan names DP, not TP"
        assert p["outcome"] == "cancelled" and p["why"] == ended, p
    assert render(summary).count("cancelled at step") == begun


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
    assert all(s.kind == ("precopy" if (s.step // 4) % turns % 2 else "one_step") for s in done)
    assert all((s.precopy == {}) == (s.kind == "one_step") for s in done)
    handed = sum(s.kind == "precopy" for s in done)
    counts = summary.precopy_counts
    assert counts["handed_off"] == handed and counts["fell_back"] == 0 and counts["cancelled"] <= 1, counts


def test_the_scheduler_explains_its_choice_in_auto_mode(rank_pools):
    """The default job's one switch (TP to DP: its KV is only discarded, so nothing to pre-copy):
    the scheduler costs both ways and switches in one step."""
    summary = rank_pools(2).run(serve, Job("cpu-tiny", "rollout-tiny", switch_mode="auto"))[0]
    assert [(s.src, s.dst) for s in summary.switches] == [("TP", "DP")]
    assert "one-step switch:" in summary.switches[0].reason and "exposed (Eq 7)" in summary.switches[0].reason
    assert summary.check["passed"]


class _FakePreCopy:
    """Complete at once unless ``layers`` are left to copy (one per step, each of 1 MiB, none
    where ``paused``); ``fail`` cancels it in its first step, as a failed copy does."""

    def __init__(self, dst, steps, layers=0, paused="", fail=""):
        self.dst, self.steps, self.pending, self.cancelled = dst, steps, list(range(layers)), False
        self.holding = set()
        self.steps_run, self.paused, self.fail = 0, paused, fail

    @property
    def complete(self):
        return not self.pending and not self.cancelled

    @property
    def due(self):
        return self.steps_run >= self.steps

    def step(self, batch, tokens):
        from splash_core.runtime.switch import PreCopyReport

        self.steps_run += 1
        copied = () if self.paused or self.fail else tuple(self.pending[:1])
        self.pending = self.pending[len(copied):]
        self.holding.update(copied)
        if self.fail:
            self.cancel()
        return "ran beside", PreCopyReport(self.dst, self.steps_run, copied, len(copied) << 19, self.complete, 0.5,
                                           self.paused, self.fail, group_bytes=len(copied) << 20)

    def cancel(self):  # as PreCopy's: nothing is left to copy, nothing held
        self.pending, self.cancelled = [], True
        self.holding.clear()


class _FakeExecutor:
    """Refuses every handoff of a pre-copy (its copies held push Eq 5 over), takes the one-step switch."""

    def __init__(self, refuse_handoff=True, **precopy):
        from types import SimpleNamespace

        self.model = SimpleNamespace(T=2, page_size=16, layers=[SimpleNamespace(layout=DP)],
                                     step=lambda batch, tokens: "ran in DP")
        self.calls, self.made, self.refuse, self.kw = [], [], refuse_handoff, precopy

    def precopy(self, dst, batch, steps):
        self.made.append(_FakePreCopy(dst, steps, **self.kw))
        return self.made[-1]

    def step(self, batch, tokens, dst, mode, *, plan, precopy):
        from splash_core.runtime.switch import SwitchRefused

        self.calls.append((plan, precopy is not None))
        if precopy is not None and self.refuse:
            raise SwitchRefused("Eq 5: over budget with the copies held")
        return "switched", "report"


def test_a_refused_handoff_falls_back_to_the_one_step_switch():
    from splash_core.engine.plan import Command, StepPlan
    from splash_core.engine.precopies import PreCopies
    from splash_core.runtime.step_batch import StepRequest

    executor = _FakeExecutor()
    plan = StepPlan(Command.STEP, 0, TP, (StepRequest(0, 0, 5, 1),), np.zeros(1, np.int64))
    precopies = PreCopies(executor, 2)
    out = precopies.run(plan, None, lambda pc: "handoff plan" if pc is not None else "one-step plan")
    assert out == ("switched", "report", "", False)
    assert executor.calls == [("handoff plan", True), ("one-step plan", False)]
    assert executor.made[0].cancelled  # its copies were freed before the one-step switch
    [record] = precopies.events  # begun and fallen back in the same step
    assert (record.begun, record.ended, record.outcome, record.src, record.dst) == (0, 0, "fell_back", "DP", "TP")
    assert record.why == "the handoff was refused: Eq 5: over budget with the copies held"


def _plans(layouts):
    from splash_core.engine.plan import Command, StepPlan
    from splash_core.runtime.step_batch import StepRequest

    return [StepPlan(Command.STEP, i, layout, (StepRequest(0, 0, 5 + i, 1),), np.zeros(1, np.int64))
            for i, layout in enumerate(layouts)]


def _run(precopies, layouts):
    """Each plan's step, and the records that began or ended in it."""
    out = []
    for plan in _plans(layouts):
        step = precopies.run(plan, None, lambda pc: "plan")
        out.append((step, [dataclasses.replace(r) for r in precopies.events]))
    return out


def _booked(layouts, precopies):
    """A controller books ``precopies``'s steps of ``layouts`` (a stand-in for run_steps on rank 0)."""
    from types import SimpleNamespace

    from splash_core.engine.controller import Controller

    c = Controller([], SimpleNamespace(layouts=(DP, TP)), None, concurrency=1, prefill_chunk=1, layout=DP)
    c.requests[0] = SimpleNamespace(generated=[], advance=lambda *a: None, state=None, token_times=[], done=False)
    for plan in _plans(layouts):
        _, report, refused, copying = precopies.run(plan, None, lambda pc: "plan")
        c.record(plan, np.zeros(1, np.int64), 0.0, TP if report else DP, refused, copying, precopies.events)
    return c


def test_a_precopy_that_paused_past_its_steps_falls_back_and_says_why():
    """3 layers to copy in 2 steps, memory short every step: the third step switches in one step."""
    from splash_core.engine.precopies import PreCopies

    executor = _FakeExecutor(refuse_handoff=False, layers=3, paused="KV pool: rank 1 layer 0 has too few pages")
    steps = _run(PreCopies(executor, 2), (TP, TP, TP))
    assert [s[0][3] for s in steps] == [True, True, False] and steps[2][0][:2] == ("switched", "report")
    assert executor.calls == [("plan", False)] and executor.made[0].cancelled
    [record] = steps[2][1]
    assert (record.outcome, record.ended, record.steps_run, record.paused_steps, record.layers, record.bytes) == \
        ("fell_back", 2, 2, 2, 0, 0)
    assert record.why == "3 layers not copied after 2 steps (KV pool: rank 1 layer 0 has too few pages)"
    booked = _booked((TP, TP, TP), PreCopies(_FakeExecutor(refuse_handoff=False, layers=3, paused="short"), 2))
    [switch] = booked.switches
    assert switch.step == 2 and switch.precopy.outcome == "fell_back"
    assert booked.precopy_counts == {"begun": 1, "handed_off": 0, "cancelled": 0, "fell_back": 1}


def test_a_failed_copy_cancels_the_precopy_and_the_next_plan_begins_another():
    from splash_core.engine.precopies import PreCopies

    executor = _FakeExecutor(refuse_handoff=False, layers=2, fail="gloo timed out")
    steps = _run(PreCopies(executor, 2), (TP, TP))
    assert [r.outcome for _, records in steps for r in records] == ["cancelled", "cancelled"]
    assert all(r.why == "gloo timed out" and r.begun == r.ended for _, records in steps for r in records)
    assert len(executor.made) == 2 and executor.calls == []


def test_a_handed_off_precopy_counts_its_background_bytes_and_books_the_switch():
    """2 layers over 2 steps (1 MiB each over the group), handed off at the third step."""
    from splash_core.engine.precopies import PreCopies

    booked = _booked((TP, TP, TP), PreCopies(_FakeExecutor(refuse_handoff=False, layers=2), 2))
    [switch] = booked.switches
    p = switch.precopy
    assert (switch.step, p.outcome, p.begun, p.ended, p.steps_run, p.layers, p.bytes, p.host_ms) == \
        (2, "handed_off", 0, 2, 2, 2, 2 << 20, 1.0)
    assert booked.precopy_counts == {"begun": 1, "handed_off": 1, "cancelled": 0, "fell_back": 0}


def test_an_incomplete_precopy_hands_off_what_it_copied():
    """3 layers over 2 steps: 2 copied, the third moves whole in the handoff (no fall back)."""
    from splash_core.engine.precopies import PreCopies

    executor = _FakeExecutor(refuse_handoff=False, layers=3)
    steps = _run(PreCopies(executor, 2), (TP, TP, TP))
    assert executor.calls == [("plan", True)] and not executor.made[0].cancelled
    [record] = steps[2][1]
    assert (record.outcome, record.layers, record.uncopied, record.bytes) == ("handed_off", 2, 1, 2 << 20)
    # refused (Eq 5 with the copies held): the one-step switch, and the record says why
    executor = _FakeExecutor(refuse_handoff=True, layers=3)
    steps = _run(PreCopies(executor, 2), (TP, TP, TP))
    assert executor.calls == [("plan", True), ("plan", False)] and steps[2][1][0].outcome == "fell_back"
