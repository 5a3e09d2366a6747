"""``splash run``: the default main job end to end (the scheduler decides every step, any switch
it makes runs live, and the outputs equal the single-device reference), and one-line errors with
exit code 2 for bad input. Live switches in every direction are exercised by
tests/test_engine_serve.py's scripted policy; whether the default job switches depends on the
calibrated CPU profile (with its measured host overheads TP is fastest on the CPU runtime)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from splash_core.cli.main import main
from splash_core.profiles import load


def splash(*args, timeout=300):
    exe = shutil.which("splash") or pytest.skip("console script `splash` not installed")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def test_the_default_job_matches_the_reference():
    done = splash("run", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    specs = load("workload", "rollout-tiny").requests()
    assert (out["deployment"], out["workload"], out["policy"], out["T"]) == ("cpu-tiny", "rollout-tiny", "splash", 2)
    assert out["served"] == len(specs) and out["output_tokens"] == sum(s.max_new_tokens for s in specs)
    assert out["switch_count"] == len(out["switches"])
    assert sum(out["layout_steps"].values()) == out["steps"]
    assert all(switch["dst"] in out["layout_steps"] for switch in out["switches"])  # a switch runs its target
    assert out["switches"] or len(out["layout_steps"]) == 1
    for switch in out["switches"]:
        assert switch["src"] != switch["dst"] and switch["reason"].startswith("switch ")
        assert switch["bytes_total"] == sum(switch["bytes"].values())
    assert out["check"]["passed"] and out["check"]["exact"] and out["check"]["tokens"] == out["output_tokens"]
    assert out["tokens_per_s"] > 0
    latency = out["latency"]  # the same metrics a served run reports: from arrival, between tokens, to the last
    assert latency["ttft_ms"]["count"] == latency["e2e_ms"]["count"] == len(specs)
    assert latency["itl_ms"]["count"] == out["output_tokens"] - len(specs)
    for d in latency.values():
        assert 0 < d["p50"] <= d["p90"] <= d["p99"]
    assert latency["ttft_ms"]["p50"] < latency["e2e_ms"]["p50"]
    assert "tokens [" not in done.stderr  # no progress bar under --json


def test_an_fp8_kv_job_switches_through_every_layout_and_matches_the_reference():
    """Deployment cpu-tiny-fp8kv: the KV cache in DeepSeek-V3.2's scaled fp8 format (64 bytes a
    token and layer on the tiny model), forced through all four layouts. Switches move whole
    pages of that format; the reference rounds its history the same way and the check allows
    near-ties within e4m3's unit roundoff (1/16)."""
    script = "script:TP,CP,DOP,DP,CP,TP,DOP,TP,DP,DOP,CP,DP,TP:4"
    done = splash("run", "--deployment", "cpu-tiny-fp8kv", "--policy", script, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    specs = load("workload", "rollout-tiny").requests()
    assert out["served"] == len(specs) and set(out["layout_steps"]) == {"TP", "CP", "DOP", "DP"}
    assert out["check"]["passed"] and not out["check"]["exact"] and out["check"]["tolerance"] == 2 ** -4
    kv = [switch["bytes"]["kv"] for switch in out["switches"]]
    assert any(kv) and all(b % (16 * 64) == 0 for b in kv)  # whole 16-token pages of 64-byte entries


@pytest.mark.parametrize("args, message", [
    (["--workload", "no-such-workload"], "no workload profile named 'no-such-workload'"),
    (["--deployment", "no-such.yaml"], "deployment profile no-such.yaml: the file does not exist"),
    (["--policy", "XP"], "unknown policy 'XP'"),
    (["--prefill-chunk", "0"], "argument --prefill-chunk: must be >= 1 (got 0)"),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys, args, message):
    assert main(["run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("splash run: error: ") and message in err


def test_a_malformed_workload_names_the_field(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: workload\nrollout: {requests: 0, prompt_tokens: [4, 8], output_tokens: [1, 2]}\n")
    assert main(["run", "--workload", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "requests" in err
