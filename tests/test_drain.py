"""A rollout that drains from wide to long: the winner changes, SPLASH follows it, and the live
scheduler makes the simulator's choices (issue 35)."""

from __future__ import annotations

import json

from splash_core.cli.main import main
from splash_core.profiles import load
from splash_core.studies.simulator import SPLASH, simulate


def test_the_live_scheduler_makes_the_simulators_choices(capsys):
    """drain-tiny on cpu-tiny (the scaled-down drain-x8): the simulator's SPLASH switches as the
    winner changes and beats every fixed layout; `splash run --policy splash` on CPU ranks
    switches at the same steps into the same layouts and runs as many steps in each."""
    sim = simulate(load("deployment", "cpu-tiny"), load("workload", "drain-tiny"))
    modelled = sim.result(SPLASH)
    assert modelled.switches and len(sim.phases()) >= 2
    assert sim.regret() and max(sim.regret().values()) <= 1.0
    assert main(["run", "--workload", "drain-tiny", "--policy", "splash", "--no-check", "--json"]) == 0
    live = json.loads(capsys.readouterr().out)
    assert live["served"] == 16
    assert [(s["step"], s["src"], s["dst"]) for s in live["switches"]] == \
        [(e.step, str(e.src), str(e.dst)) for e in modelled.switches]
    assert live["layout_steps"] == modelled.layout_steps


def test_simulate_prints_splashs_phases_and_its_time_over_every_fixed_layout(capsys):
    assert main(["simulate", "--deployment", "cpu-tiny", "--workload", "drain-tiny", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["layout"] for p in out["splash_phases"]] == ["TP", "DP"]
    assert set(out["splash_time_over_fixed"]) == {"TP", "CP", "DP", "DOP"}
    assert main(["simulate", "--deployment", "cpu-tiny", "--workload", "drain-tiny"]) == 0
    assert "SPLASH's phases: TP 0-" in capsys.readouterr().out
