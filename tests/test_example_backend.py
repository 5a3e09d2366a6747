"""The example backend of docs/plugins.md (examples/splash-backend-simulated): it passes the
conformance suite through the command a vendor runs, its collectives count what they move,
its example deployment passes ``splash profiles check`` and serves a workload through every
layout with outputs equal to the single-device reference, and the guide quotes its code as it is."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from splash_core.cli.main import main

try:
    importlib.metadata.distribution("splash-backend-simulated")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("the example backend is not installed (pip install -e examples/splash-backend-simulated)",
                allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "splash-backend-simulated"
DEPLOYMENT = EXAMPLE / "simulated-tiny.yaml"
GUIDE = EXAMPLE.parents[1] / "docs" / "plugins.md"
ENV = {**os.environ, "SPLASH_BACKENDS": "simulated,reference"}  # the backend and what it falls back to


def test_conformance_suite_passes_for_the_simulated_backend(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "splash_core.testing", "--backend", "simulated", "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout


def test_auto_never_picks_the_simulated_backend():
    from splash_core.platform import plugins
    from splash_core.platform.backend import get_backend

    registry = plugins.load()
    assert registry.check("simulated") is None and not registry.info("simulated").accelerator
    backend = get_backend("simulated", registry)
    assert backend.chain == ["simulated", "reference"]
    assert plugins.select(registry, "auto") != "simulated"
    assert Path(backend.hardware_profile()).name == "simulated.yaml"  # the shipped starting profile


def _counted_exchange(ctx):
    """The example's counting collectives over the pool's group: an uneven all-to-all (rank s
    sends s + 2d rows of 3 float32 to rank d) and an all-gather of 2 rows each; the counts."""
    import torch
    from splash_backend_simulated.collectives import CountingCollectives

    coll = CountingCollectives(ctx.group, ctx.device)
    me, size = coll.rank, coll.size
    in_splits, out_splits = [me + 2 * d for d in range(size)], [s + 2 * me for s in range(size)]
    out = torch.empty(sum(out_splits), 3)
    coll.all_to_all(out, torch.full((sum(in_splits), 3), float(me)), out_splits, in_splits)
    assert out.tolist() == [[float(s)] * 3 for s, n in enumerate(out_splits) for _ in range(n)]
    coll.all_gather_into(torch.empty(2 * size, 3), torch.ones(2, 3))
    return dict(coll.calls), dict(coll.bytes)


def test_counting_collectives_count_bytes_received(rank_pools):
    counts = rank_pools(2).run(_counted_exchange)
    for me, (calls, moved) in enumerate(counts):
        peer = 1 - me
        assert calls == {"all_to_all": 1, "all_gather": 1}
        assert moved == {"all_to_all": (peer + 2 * me) * 3 * 4, "all_gather": 2 * 3 * 4}


def test_example_deployment_passes_profiles_check(capsys):
    assert main(["profiles", "check", str(DEPLOYMENT)]) == 0
    assert "(deployment simulated-tiny)" in capsys.readouterr().out


def test_example_deployment_serves_through_every_layout(tmp_path):
    """A scripted policy visits DP, DOP, CP and TP, so switches run over the example's side
    collectives (with their reused transfer buffers) and its decode kernel computes in every layout."""
    proc = subprocess.run(
        [sys.executable, "-m", "splash_core.cli.main", "run", "--deployment", str(DEPLOYMENT),
         "--policy", "script:DP,DOP,CP,TP:6", "--json"],
        capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert (out["deployment"], out["backend"], out["T"]) == ("simulated-tiny", "simulated", 2)
    assert set(out["layout_steps"]) == {"TP", "CP", "DP", "DOP"} and out["switch_count"] >= 4
    assert out["check"]["passed"] and out["check"]["exact"] and out["check"]["tokens"] == out["output_tokens"] > 0


def test_the_guide_quotes_the_example_as_it_is():
    """Every code block of docs/plugins.md that starts with a comment naming a file of the example
    is a verbatim excerpt of that file."""
    quotes = re.findall(r"^```\w+\n# (examples/splash-backend-simulated/\S+)\n(.*?)^```", GUIDE.read_text(), re.M | re.S)
    assert len(quotes) >= 4, quotes
    for path, body in quotes:
        assert body in (EXAMPLE.parents[1] / path).read_text(), f"docs/plugins.md quotes {path} as it is not"
