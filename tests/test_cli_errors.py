"""Bad input to any command is one line naming the file, flag or key and the cause, exit code 2,
no traceback, and nothing started: budgets that hold nothing, requests that can never run, KV
formats the runtime cannot store, duplicate YAML keys, backends that are not installed, bad
arguments, missing files and folders given as files."""

from __future__ import annotations

import re

import pytest
from cli_lines import one_line

from splash_core.cli.main import main
from splash_core.profiles import ProfileError, load_file
from splash_core.profiles.loader import builtin_root

SHIPPED = builtin_root()
# cpu-tiny on the synthetic tiny model (the shipped one serves a checkpoint), so a test can swap the model
DEPLOYMENT = re.sub(r"^model: .*$", "model: tiny-mla", (SHIPPED / "deployments" / "cpu-tiny.yaml").read_text(), flags=re.M)
MODEL = (SHIPPED / "models" / "tiny-mla.yaml").read_text()


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- budgets, requests and KV formats: refused before any rank starts -------------------

@pytest.mark.parametrize("change, key", [
    ("common_gib: 100.0\n", "common_gib"),
    ("reserve_gib: 7.9999\n", "memory_fraction"),  # the reserve leaves 100 KiB: less than the weights
])
def test_a_budget_that_holds_nothing_fails_check_and_every_command(tmp_path, capsys, no_ranks, change, key):
    path = write(tmp_path, "d.yaml", DEPLOYMENT.replace("reserve_gib: 0.0\n", change))
    expected = f"{path}: {key}: the memory budget leaves no room for weights and KV: hardware.memory_gib 16"
    assert main(["profiles", "check", str(path)]) == 2
    assert capsys.readouterr().err.startswith(expected)
    for argv in (["run", "--deployment", str(path)], ["decide", "--deployment", str(path), "--requests", "1x10"],
                 ["simulate", "--deployment", str(path), "--workload", "rollout-tiny"]):
        assert main(argv) == 2
        assert one_line(capsys, argv[0]).startswith(f"splash {argv[0]}: error: {expected}")


def test_a_device_without_memory_is_refused(tmp_path, capsys):
    hardware = (SHIPPED / "hardware" / "cpu.yaml").read_text()
    start = hardware.index("memory_gib: {value: ") + len("memory_gib: {value: ")
    path = write(tmp_path, "h.yaml", hardware[:start] + "0" + hardware[hardware.index(",", start):])
    assert main(["profiles", "check", str(path)]) == 2
    assert capsys.readouterr().err == f"{path}: memory_gib.value: must be > 0: nothing would fit on the device (got 0.0)\n"
    deployment = write(tmp_path, "d.yaml", DEPLOYMENT.replace("hardware: cpu", f"hardware: {path}"))
    assert main(["run", "--deployment", str(deployment)]) == 2
    assert f"{path}: memory_gib.value: must be > 0" in one_line(capsys, "run")


def test_a_request_that_can_never_fit_is_refused_before_the_pool(capsys, no_ranks):
    # one page of 16 tokens per layer and rank; every request of rollout-tiny needs more
    assert main(["run", "--kv-pages", "1"]) == 2
    line = one_line(capsys, "run")
    assert "workload 'rollout-tiny': request 0 can never run (11 more like it): " in line
    assert "than the pool's 1 (16 tokens each)" in line and line.endswith("raise --kv-pages or shorten the requests")


def test_a_fixed_layout_counts_only_its_own_capacity(capsys, no_ranks):
    # 9 pages hold any one request in CP (split over both ranks) but not all of them in DP
    assert main(["run", "--kv-pages", "9", "--policy", "DP"]) == 2
    assert "in DP under policy DP" in one_line(capsys, "run")


@pytest.mark.parametrize("kv_cache, why", [
    ("{latent_dtype: fp8, rope_dtype: fp8, scale_bytes: 16}", "a scaled cache stores an fp8 latent, float32 scales"),
    ("{latent_dtype: fp8, rope_dtype: bf16, scale_bytes: 12}", "3 scales do not split the 32 latent channels"),
    ("{latent_dtype: fp8, rope_dtype: bf16}", "without scales the runtime stores latent and rotary key in one format"),
    ("{latent_dtype: int8, rope_dtype: int8}", "the runtime stores the KV cache in fp32, bf16, fp16, fp8, or fp8 with scales"),
])
def test_a_kv_format_the_runtime_cannot_store_is_refused(tmp_path, capsys, no_ranks, kv_cache, why):
    model = write(tmp_path, "m.yaml", MODEL.replace("{latent_dtype: fp32, rope_dtype: fp32}", kv_cache))
    deployment = write(tmp_path, "d.yaml", DEPLOYMENT.replace("model: tiny-mla", f"model: {model}"))
    assert main(["run", "--deployment", str(deployment)]) == 2
    line = one_line(capsys, "run")
    assert "deployment 'cpu-tiny': model.kv_cache: " in line and why in line
    assert main(["profiles", "check", str(deployment)]) == 0  # the cost-model commands can still use it
    assert f"ok  {deployment} (deployment cpu-tiny; cost-model commands only: " in capsys.readouterr().out


def test_the_shipped_fp8_deployment_checks_and_runs(capsys):
    """DeepSeek-V3.2's scaled fp8 cache (656 bytes a token and layer) is one the runtime stores."""
    path = SHIPPED / "deployments" / "h200-x8-deepseek-v3.2.yaml"
    assert main(["profiles", "check", str(path), "--json"]) == 0
    import json

    (result,) = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["runtime"] == "runs"


# ---- profiles: duplicate keys, backends that are not installed, files ----------------------

def test_a_duplicate_key_names_the_key_and_both_lines(tmp_path, capsys):
    text = DEPLOYMENT.replace("scheduler: {margin: 0.05}", "scheduler:\n  margin: 0.05\n  margin: 0.5")
    path = write(tmp_path, "d.yaml", text)
    lines = text.splitlines()
    first, second = (i + 1 for i, line in enumerate(lines) if line.strip().startswith("margin:"))
    message = f"{path}: scheduler.margin: duplicate key 'margin' (lines {first} and {second})"
    with pytest.raises(ProfileError, match="duplicate key"):
        load_file("deployment", path)
    assert main(["profiles", "check", str(path)]) == 2
    assert capsys.readouterr().err == message + "\n"
    assert main(["run", "--deployment", str(path)]) == 2
    assert one_line(capsys, "run") == f"splash run: error: {message}"
    top = write(tmp_path, "top.yaml", DEPLOYMENT + "T: 4\n")  # a top-level key given twice
    assert main(["profiles", "check", str(top)]) == 2
    assert f"{top}: T: duplicate key 'T' (lines 6 and {len(DEPLOYMENT.splitlines()) + 1})" in capsys.readouterr().err


def test_a_backend_that_is_not_installed_fails_check(tmp_path, capsys):
    path = write(tmp_path, "d.yaml", DEPLOYMENT.replace("backend: reference", "backend: refrence"))
    assert main(["profiles", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: backend: no backend named 'refrence' is installed (installed: ")
    assert "reference" in err and len(err.splitlines()) == 1
    cuda = write(tmp_path, "cuda.yaml", DEPLOYMENT.replace("backend: reference", "backend: cuda"))
    assert main(["profiles", "check", str(cuda)]) == 0  # installed, though not usable on this machine
    capsys.readouterr()


def test_a_missing_file_and_a_folder_given_as_a_file(tmp_path, capsys):
    assert main(["run", "--deployment", str(tmp_path / "nope.yaml")]) == 2
    assert one_line(capsys, "run").endswith(f"deployment profile {tmp_path / 'nope.yaml'}: the file does not exist")
    assert main(["weights", "--model", str(tmp_path), "--T", "2"]) == 2
    assert one_line(capsys, "weights").endswith(f"model profile {tmp_path}: is a directory, not a file")
    assert main(["profiles", "check", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"{tmp_path}: (file): is a directory, not a file\n"
    deployment = write(tmp_path, "d.yaml", DEPLOYMENT.replace("model: tiny-mla", "model: ./no-model.yaml"))
    assert main(["profiles", "check", str(deployment)]) == 2
    assert capsys.readouterr().err == (f"{deployment}: model: model profile ./no-model.yaml: "
                                       "the file does not exist\n")


# ---- arguments ---------------------------------------------------------------------------

PLAN = ["plan", "--from", "TP", "--to", "DP", "--model", "tiny-mla", "--T", "2", "--context", "10"]


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--deployment", "cpu-tiny", "--workload", "rollout-tiny", "--plot", "x.txt"],
     "argument --plot: x.txt: unsupported figure format '.txt'; use .png, .svg, .pdf"),
    (["crossovers", "--scenario", "fig1-b200", "--plot", "no-such-dir/x.png"],
     "argument --plot: no-such-dir/x.png: folder no-such-dir does not exist"),
    (["run", "--timeout", "-1"], "argument --timeout: must be > 0 (got -1)"),
    (PLAN + ["--batch", "0"], "argument --batch: must be >= 1 (got 0)"),
    (PLAN + ["--batch", "2", "--layers", "0"], "argument --layers: must be >= 1 (got 0)"),
    (PLAN + ["--batch", "2", "--memory-gib", "-1"], "argument --memory-gib: must be > 0 (got -1)"),
    (PLAN + ["--batch", "two"], "argument --batch: expected a whole number (got 'two')"),
    (["calibrate", "--out", "x.yaml", "--layers", "0"], "argument --layers: must be >= 1 (got 0)"),
    (["run", "--policy", "script:TP,DP:x"],
     "policy 'script:TP,DP:x': STEPS (steps per layout) must be a whole number >= 1 (got 'x')"),
    (["run", "--policy", "script:TP,DP:0"],
     "policy 'script:TP,DP:0': STEPS (steps per layout) must be a whole number >= 1 (got '0')"),
    (["decide", "--deployment", "cpu-tiny", "--requests", "1x10", "--query-rows", "0"],
     "argument --query-rows: must be >= 1 (got 0)"),
])
def test_bad_arguments_are_one_line_errors(capsys, no_ranks, argv, message):
    assert main(argv) == 2
    assert one_line(capsys, argv[0]) == f"splash {argv[0]}: error: {message}"


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_torchrun_world_that_differs_from_t_is_refused_by_rank_0_alone(monkeypatch, capsys, no_ranks, command):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    argv = [command, "--port", "0"] if command == "serve" else [command]
    assert main(argv) == 0  # rank 0 says it; another rank leaving with a failure would cut rank 0 short
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert main(argv) == 2
    assert one_line(capsys, command) == (f"splash {command}: error: torchrun started 3 processes, but deployment "
                                         "'cpu-tiny' has T = 2: start one process per rank "
                                         "(--nnodes x --nproc-per-node = 2)")


def test_calibrate_does_not_overwrite_a_profile_unless_forced(tmp_path, capsys):
    out = write(tmp_path, "h200.yaml", "kept\n")
    assert main(["calibrate", "--backend", "reference", "--out", str(out)]) == 2
    assert one_line(capsys, "calibrate") == (f"splash calibrate: error: --out {out}: the file exists; write a new "
                                             "file, or pass --force to replace it")
    assert main(["calibrate", "--backend", "reference", "--out", str(tmp_path)]) == 2
    assert one_line(capsys, "calibrate").endswith("is a directory, not a file")
    assert out.read_text() == "kept\n"  # (--force writing over it: tests/test_calibrate.py)
