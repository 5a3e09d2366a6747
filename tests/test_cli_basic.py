"""The ``splash`` console script and the plan / profiles / weights commands: readable tables,
``--json`` for scripts, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from splash_core.cli.main import main
from splash_core.layouts import Layout, State
from splash_core.planning.manifest import plan_switch
from splash_core.planning.ownership import Batch
from splash_core.profiles import load

MIB = 1 << 20


def splash(*args):
    exe = shutil.which("splash") or pytest.skip("console script `splash` not installed")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def test_console_script_lists_the_commands_and_fails_cleanly():
    help_text = splash("--help")
    assert help_text.returncode == 0
    for command in ("backends", "profiles", "weights", "plan"):
        assert command in help_text.stdout
    bad = splash("plan", "--from", "TP", "--to", "XP", "--model", "tiny-mla", "--T", "2",
                 "--batch", "2", "--context", "10")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "splash plan: error: unknown layout 'XP'; expected one of TP, CP, DP, DOP"


def test_plan_json_matches_the_planner(capsys):
    args = ["plan", "--from", "DOP", "--to", "CP", "--model", "deepseek-v3.2", "--T", "8",
            "--batch", "16", "--context", "16k", "--layers", "2", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    man = plan_switch(Layout.DOP, Layout.CP, Batch.balanced(16, 16384, 8), load("model", "deepseek-v3.2"),
                      8, 64, layers=range(2))
    assert out["layers"] == 2 and out["T"] == 8
    states = {row["state"]: row for row in out["states"]}
    assert states["weights"]["primitive"] == "all_gather" and states["kv"]["primitive"] == "all_to_all"
    assert states["kv"]["fetched_per_layer"] == man.layers[0].states[State.KV].fetched_bytes.tolist()
    assert out["fetched_bytes_per_rank"] == man.fetched_bytes().tolist()
    assert out["peak_bytes"] == man.peak.tolist()
    assert "fit" not in out


def test_plan_table_and_fit(capsys):
    assert main(["plan", "--from", "TP", "--to", "DP", "--model", "deepseek-v3", "--T", "8", "--batch", "8",
                 "--context", "4k", "--memory-gib", "1", "--reserve-gib", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "weights  all_gather" in out and "kv       discard" in out
    assert "287" in out  # MiB per layer per rank received by the weight all-gather (Eq 9)
    assert "Eq 5 peak" in out and "does not fit" in out


def test_plan_unequal_contexts_and_errors(capsys):
    assert main(["plan", "--from", "CP", "--to", "DOP", "--model", "tiny-hybrid", "--T", "2", "--batch", "3",
                 "--context", "10,1k,0", "--page-size", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {(r["kind"], r["state"]) for r in out["states"]} == {
        ("mla", "weights"), ("mla", "kv"), ("kda", "weights"), ("kda", "recurrent")}
    cases = [
        (["--context", "10,20"], "--context gives 2 values for --batch 3"),
        (["--context", "lots"], "bad token count 'lots'"),
        (["--context", "10", "--T", "5"], "does not divide"),
        (["--context", "10", "--T", "0"], "argument --T: must be >= 1 (got 0)"),
    ]
    for extra, message in cases:
        base = {"--from": "TP", "--to": "CP", "--model": "tiny-hybrid", "--T": "2", "--batch": "3"}
        for flag, value in zip(extra[::2], extra[1::2]):
            base[flag] = value
        argv = ["plan"] + [x for kv in base.items() for x in kv]
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err


def test_profiles_listing_is_a_table(capsys):
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["kind", "profiles"]
    assert "deepseek-v3.2" in out and "search path:" in out


def test_weights_table_sums(capsys):
    assert main(["weights", "--model", "deepseek-v3", "--T", "8", "--dtype", "fp8"]) == 0
    out = capsys.readouterr().out
    assert "143.5" in out and "analytical" in out
    assert "8,753.50 MiB per rank" in out  # 61 layers x 143.5 MiB
