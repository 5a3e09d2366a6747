"""The conformance suite runs green against the reference backend, through the exact
command a vendor runs against its own plugin."""

from __future__ import annotations

import os
import subprocess
import sys


def test_conformance_suite_passes_for_the_reference_backend(tmp_path):
    env = {**os.environ, "SPLASH_BACKENDS": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "splash_core.testing", "--splash-backend", "reference",
         "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout


def test_unusable_backend_fails_with_the_reason(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "splash_core.testing", "--backend", "hopper", "-q", "-p", "no:cacheprovider",
         "-k", "info_names"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    if proc.returncode == 0:  # a machine where hopper is usable
        return
    assert "backend 'hopper' cannot be checked on this machine" in proc.stdout
