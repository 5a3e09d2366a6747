"""``splash --version``, ``splash --help`` and every ``splash COMMAND --help`` answer without
importing torch or matplotlib (they cost seconds): the subcommand modules import them only when
their command runs."""

from __future__ import annotations

import subprocess
import sys

from splash_core.cli.main import COMMANDS

HEAVY = ("torch", "matplotlib", "triton", "transformers")
PROBE = """
import contextlib, io, sys
from splash_core.cli.main import COMMANDS, main
for argv in (["--version"], ["--help"], *([name, "--help"] for name in COMMANDS)):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(argv) == 0, argv
    assert out.getvalue(), argv
print(" ".join(m for m in {heavy!r} if m in sys.modules))
"""


def heavy_modules_loaded(preamble: str = "") -> list[str]:
    """The heavy modules a fresh interpreter holds after answering every --help and --version."""
    code = preamble + PROBE.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_help_and_version_import_no_torch_or_matplotlib():
    assert len(COMMANDS) >= 14
    assert heavy_modules_loaded() == []


def test_the_check_sees_a_heavy_import():
    assert heavy_modules_loaded("import torch\n") == ["torch"]  # a command module importing torch at its top


def test_calibrates_graph_modes_are_the_runtimes():
    from splash_core.cli.calibrate import GRAPH_MODES
    from splash_core.runtime.step_timing import GRAPH_MODES as RUNTIME_GRAPH_MODES

    assert GRAPH_MODES == RUNTIME_GRAPH_MODES
