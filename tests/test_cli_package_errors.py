"""Bad input that used to reach users as a traceback is one line naming the cause, exit code 2:
outputs that cannot be written (refused while the command line is parsed, before any work),
drawing without matplotlib, profile files that are not UTF-8 or contain themselves, a truncated
safetensors file, and a torchrun world of the wrong size (rank 0 says so once, the rest stay
quiet). Also: ``python -m splash_core.cli[.main]`` runs the command."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
from cli_lines import one_line

from splash_core import __version__
from splash_core.cli.args import NO_MATPLOTLIB, writable_dir, writable_file
from splash_core.cli.main import main
from splash_core.profiles import ProfileError
from splash_core.profiles.loader import read_yaml

NO_FILES_HERE = "/proc"  # a folder in which no process, root included, may create a file


# ---- outputs that cannot be written: refused before the work ----------------------------

SIMULATE = ["simulate", "--deployment", "cpu-tiny", "--workload", "rollout-tiny"]
SWEEP = ["sweep", "--deployment", "cpu-tiny", "--batch", "2", "--inputs", "64", "--output", "8"]


@pytest.mark.parametrize("argv, flag", [
    (SIMULATE + ["--plot", f"{NO_FILES_HERE}/x.png"], "--plot"),
    (["crossovers", "--scenario", "fig1-b200", "--plot", f"{NO_FILES_HERE}/x.svg"], "--plot"),
    (SWEEP + ["--plot", f"{NO_FILES_HERE}/x.png"], "--plot"),
    (SWEEP + ["--out", f"{NO_FILES_HERE}/results"], "--out"),
    (["report", "--out", f"{NO_FILES_HERE}/report/deeper"], "--out"),
    (["calibrate", "--backend", "reference", "--out", f"{NO_FILES_HERE}/h.yaml"], "--out"),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(capsys, argv, flag):
    assert main(argv) == 2
    line = one_line(capsys, argv[0])
    assert line.startswith(f"splash {argv[0]}: error: argument {flag}: {NO_FILES_HERE}/")
    assert f"cannot write in folder {NO_FILES_HERE}: " in line


def test_the_refusal_names_the_folder_and_the_cause(capsys):
    assert main(SIMULATE + ["--plot", f"{NO_FILES_HERE}/x.png"]) == 2
    line = one_line(capsys, "simulate")  # the cause as the system gives it (root: no such file; others: permission)
    assert re.fullmatch(f"splash simulate: error: argument --plot: {NO_FILES_HERE}/x.png: cannot write in folder "
                        f"{NO_FILES_HERE}: (No such file or directory|Permission denied)", line), line
    assert main(["calibrate", "--out", "/proc/version", "--force"]) == 2  # exists, and may not be written
    assert "argument --out: /proc/version: cannot write the file: " in one_line(capsys, "calibrate")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in folders without write permission")
def test_a_folder_without_write_permission_is_refused(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(SWEEP + ["--out", str(locked / "results")]) == 2
    assert one_line(capsys, "sweep").endswith(f"cannot write in folder {locked}: Permission denied")


def test_writable_places_pass_and_the_probe_leaves_nothing(tmp_path):
    assert writable_file(str(tmp_path / "x.png")) == str(tmp_path / "x.png")
    assert writable_dir(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    (tmp_path / "kept.yaml").write_text("kept\n")
    assert writable_file(str(tmp_path / "kept.yaml"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.yaml"]
    assert (tmp_path / "kept.yaml").read_text() == "kept\n"
    with pytest.raises(argparse.ArgumentTypeError, match="is a file, not a directory"):
        writable_dir(str(tmp_path / "kept.yaml"))
    with pytest.raises(argparse.ArgumentTypeError, match="kept.yaml is a file, not a directory"):
        writable_dir(str(tmp_path / "kept.yaml" / "below"))


def test_drawing_without_matplotlib_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the report extra were not installed
    assert main(SIMULATE + ["--plot", str(tmp_path / "x.png")]) == 2
    assert one_line(capsys, "simulate") == f"splash simulate: error: argument --plot: {NO_MATPLOTLIB}"
    assert main(["report", "--out", str(tmp_path / "report")]) == 2
    assert one_line(capsys, "report") == f"splash report: error: {NO_MATPLOTLIB}"
    assert not list(tmp_path.iterdir())


# ---- profile files: not UTF-8, containing themselves, nested too deeply -------------------

BAD_YAML = {
    "latin1.yaml": ("name: caf\xe9\n".encode("latin-1"), "(file): not UTF-8 text: byte 0xe9 at offset 9"),
    "list.yaml": (b"name: x\nmodel: &a [*a]\n", "model[0]: an alias inside its own anchor"),
    "map.yaml": (b"name: x\nmodel: &a {b: *a}\n", "model.b: an alias inside its own anchor"),
    "deep.yaml": (("a: " + "[" * 5000 + "]" * 5000 + "\n").encode(), "(yaml): nested too deeply to read"),
}


@pytest.mark.parametrize("name", sorted(BAD_YAML))
def test_a_profile_file_that_cannot_be_data_is_one_line(tmp_path, capsys, no_ranks, name):
    content, reason = BAD_YAML[name]
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["profiles", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"{path}: {reason}") and len(captured.err.splitlines()) == 1, captured.err
    assert main(["run", "--deployment", str(path)]) == 2  # the deployment's own fault, not --layout's
    assert one_line(capsys, "run").startswith(f"splash run: error: {path}: {reason}")


def test_aliases_used_many_times_are_data_and_a_bad_layout_is_still_blamed(tmp_path, capsys, no_ranks):
    path = tmp_path / "dag.yaml"
    path.write_text("a: &a [1, 2]\nb: &b {x: *a, y: *a}\nc: [*b, *b, {<<: *b, z: 3}]\n")
    assert read_yaml(path) == {"a": [1, 2], "b": {"x": [1, 2], "y": [1, 2]},
                               "c": [{"x": [1, 2], "y": [1, 2]}] * 2 + [{"x": [1, 2], "y": [1, 2], "z": 3}]}
    path.write_text("a: {x: 1, x: 2}\n")
    with pytest.raises(ProfileError, match="duplicate key 'x'"):
        read_yaml(path)
    assert main(["generate", "--layout", "XX", "--prompt-ids", "1"]) == 2
    assert one_line(capsys, "generate").startswith("splash generate: error: --layout: unknown layout 'XX'")


# ---- a truncated checkpoint file -----------------------------------------------------------

@pytest.fixture
def truncated_checkpoint(tmp_path):
    from splash_core.checkpoint.tiny import ensure
    from splash_core.profiles import load

    folder = tmp_path / "ckpt"
    shutil.copytree(ensure(load("deployment", "cpu-tiny").model.builtin), folder)
    weights = folder / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    return folder


@pytest.mark.parametrize("command", ["generate", "run"])
def test_a_truncated_safetensors_file_is_named_in_one_line(truncated_checkpoint, capsys, no_ranks, command):
    argv = [command, "--model", str(truncated_checkpoint)] + (["--prompt-ids", "1,2"] if command == "generate" else [])
    assert main(argv) == 2
    assert one_line(capsys, command).startswith(
        f"splash {command}: error: {truncated_checkpoint / 'model.safetensors'}: (file): not a readable safetensors "
        "file (truncated or damaged?): ")


# ---- torchrun with another number of processes than T: rank 0 fails the job in one line -----

@pytest.mark.parametrize("rank", ["0", "1", "2"])
def test_a_torchrun_world_of_the_wrong_size_is_said_once(monkeypatch, capsys, no_ranks, rank):
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "3")
    if rank != "0":  # rank 0 says it and fails the job
        assert main(["generate", "--prompt-ids", "1,2"]) == 0 and capsys.readouterr() == ("", "")
        return
    assert main(["generate", "--prompt-ids", "1,2"]) == 2
    assert one_line(capsys, "generate") == (
        "splash generate: error: torchrun started 3 processes, but deployment 'cpu-tiny' has T = 2: start one "
        "process per rank (--nnodes x --nproc-per-node = 2)")


def test_under_a_real_torchrun_of_three_processes_one_line_comes_from_splash(tmp_path):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    with port:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
                "--master-port", str(port.getsockname()[1]), "-m", "splash_core.cli.main", "generate",
                "--prompt-ids", "1,2", "--no-check"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    ours = [line for line in done.stderr.splitlines() if re.match(r"splash[ :]", line)]
    assert done.returncode != 0 and done.stdout == ""
    assert ours == ["splash generate: error: torchrun started 3 processes, but deployment 'cpu-tiny' has T = 2: start "
                    "one process per rank (--nnodes x --nproc-per-node = 2)"], done.stderr
    assert "splash_core" not in "".join(re.findall(r'File "[^"]*"', done.stderr))  # torchrun's own report only


# ---- python -m -----------------------------------------------------------------------------

@pytest.mark.parametrize("module", ["splash_core.cli", "splash_core.cli.main"])
def test_python_dash_m_runs_the_command(module):
    done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"splash {__version__} (splash-serve)\n", "")


# ---- a checkpoint without tokenizer.json: token ids still generate, text prompts are refused -------

def test_token_ids_need_no_tokenizer_and_text_names_the_missing_file(tmp_path, capsys):
    import json
    import shutil

    from splash_core.checkpoint.tiny import ensure

    folder = tmp_path / "no-tokenizer"
    shutil.copytree(ensure("tiny-deepseek-v3"), folder)
    (folder / "tokenizer.json").unlink()
    assert main(["generate", "--model", str(folder), "--prompt-ids", "3,17,5", "--max-new-tokens", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 3 and out["text"] is None
    assert main(["generate", "--model", str(folder), "--prompt", "hello"]) == 2
    assert "tokenizer.json: missing" in one_line(capsys, "generate")
