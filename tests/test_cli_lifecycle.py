"""What a person sees around a command: SIGTERM/SIGINT stop ``splash run`` and all its ranks at
once, output cut off by ``| head`` ends quietly, ``--version``, the progress bar, and tables
that read the same everywhere (no ``-0.0%``, no stray ``...`` rows, a report summary within
120 columns)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import threading
import time
from importlib import metadata

import pytest
from processes import alive as _alive
from processes import cmdline as _cmdline
from processes import descendants as _descendants

from splash_core import __version__
from splash_core.cli.main import main
from splash_core.engine.progress import Progress

# a run long enough to be interrupted: 4 requests of 3,000 generated tokens on T = 2
LONG_WORKLOAD = ("kind: workload\nseed: 1\nrollout: {requests: 4, prompt_tokens: [16, 32], "
                 "output_tokens: [3000, 3000]}\n")


def splash_exe() -> str:
    return shutil.which("splash") or pytest.skip("console script `splash` not installed")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the ranks through /proc")
def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# SIGINT also where the run inherits it ignored (a background job of a non-interactive shell;
# a test process whose SIGINT some earlier code left ignored)
@pytest.mark.parametrize("signum, code, inherited", [(signal.SIGTERM, 143, None), (signal.SIGINT, 130, None),
                                                     (signal.SIGINT, 130, _ignore_sigint)])
def test_a_signal_to_the_parent_stops_every_rank(tmp_path, signum, code, inherited):
    workload = tmp_path / "long.yaml"
    workload.write_text(LONG_WORKLOAD)
    proc = subprocess.Popen([splash_exe(), "run", "--workload", str(workload), "--no-check"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=inherited)
    out, err = _Drain(proc.stdout), _Drain(proc.stderr)
    below: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while b"tokens [" not in b"".join(err):  # rank 0 draws the bar once serving starts
            assert proc.poll() is None and time.monotonic() < deadline, b"".join(err).decode()
            time.sleep(0.1)
        below = _descendants(proc.pid)
        assert len([p for p in below if "spawn_main" in _cmdline(p)]) == 2  # the ranks (and a resource tracker)
        proc.send_signal(signum)
        try:  # the ranks get 2 s to leave, then are killed; a loaded CI machine may take longer still
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"splash run still running 60 s after signal {signum}; processes left: "
                        f"{[(p, _cmdline(p)[:100]) for p in below if _alive(p)]}; its stderr ends: "
                        f"{b''.join(err).decode()[-2000:]}")
        for reader in (out.reader, err.reader):  # ends once no process holds the pipe (no orphan writes to it)
            reader.join(timeout=30)
            assert not reader.is_alive(), "a rank still holds the terminal"
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in below) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in below if _alive(p)], "orphaned ranks"
    finally:  # whatever happened, leave no process of this test behind
        for pid in [proc.pid] * (proc.poll() is None) + [p for p in below if _alive(p)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    text = b"".join(err).decode()
    assert proc.returncode == code, text
    assert "Traceback" not in text and text.rstrip().endswith("terminated" if signum == signal.SIGTERM else "interrupted")
    assert "/12000 tokens [" in text and not out  # the bar counts the workload's tokens


class _Drain(list):
    """The chunks read from ``pipe`` by a daemon thread (``.reader``) until its writers close it."""

    def __init__(self, pipe):
        super().__init__()
        self.reader = threading.Thread(target=lambda: self.extend(iter(lambda: os.read(pipe.fileno(), 4096), b"")),
                                       daemon=True)
        self.reader.start()


def test_output_cut_off_by_its_reader_ends_quietly():
    """``splash profiles | head``: the reader is gone before splash writes."""
    proc = subprocess.Popen([splash_exe(), "profiles"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert err == "" and proc.returncode == 128 + signal.SIGPIPE


def test_version_is_the_distributions():
    done = subprocess.run([splash_exe(), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == f"splash {__version__} (splash-serve)\n"
    assert metadata.version("splash-serve") == __version__


def test_the_progress_bar_moves_with_generated_tokens():
    stream = io.StringIO()
    bar = Progress(total_tokens=200, total_requests=12, stream=stream, log_interval_s=0.0)
    bar.update(done=0, generated=0, step=0, layout="TP", switches=0)
    bar.update(done=0, generated=50, step=3, layout="DP", switches=1)  # nothing finished, yet it moves
    bar.close()
    text = stream.getvalue()
    assert "50/200 tokens" in text and " 25%" in text
    assert "step 3, DP, 0/12 requests done, 1 switch]" in text and "tokens/s" in text and "[00:00" in text
    off = io.StringIO()
    quiet = Progress(total_tokens=200, total_requests=12, enabled=False, stream=off)
    quiet.update(done=1, generated=5, step=1, layout="TP", switches=0)
    quiet.close()
    assert off.getvalue() == ""


def test_decide_prints_no_negative_zero(capsys):
    assert main(["decide", "--deployment", "cpu-tiny", "--requests", "4x100"]) == 0
    out = capsys.readouterr().out
    assert "-0.0%" not in out
    current = next(line for line in out.splitlines() if line.startswith("TP "))
    assert " 0.0% " in current


def test_profiles_show_has_one_line_per_key(capsys):
    assert main(["profiles", "show", "deployment", "cpu-tiny"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["key", "value"]
    assert not [line for line in lines if line.strip() == "..." or line.startswith(" ")]
    rows = dict(line.split(None, 1) for line in lines[2:] if len(line.split(None, 1)) == 2)
    assert rows["T"] == "2" and rows["memory_fraction"] == "0.5" and rows["layers"] == "null"
    assert rows["hardware.collective_samples[0].ranks"] == "2"


def test_report_renders_from_any_directory_and_its_summary_fits_120_columns(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no bench/ here: the project's results and paper data are found
    assert main(["report", "--out", "out"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "out" / "README.md").is_file()
    assert max(len(line) for line in out.splitlines()) <= 120, out
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line and not line.startswith(" ")}
    assert "paper" in rows["fixed_layout_sweep"] and "measured" in rows["runtime_host_profile"]
