"""bench/prefill_forms.py's logic on the tiny CPU deployment: both forms, with and without the
host's overlap, serve the same rollout and the result validates (the H200 numbers come from the same code)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from splash_core.results import read_result

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "prefill_forms.py"


def test_smoke_run_writes_both_forms(tmp_path):
    spec = importlib.util.spec_from_file_location("prefill_forms", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--smoke", "--out", str(tmp_path), "--overlap", "on,off"]) == 0
    result = read_result(tmp_path / "cpu" / "prefill_forms.json")
    samples = result["samples"]
    assert [s["form"] for s in samples] == ["absorbed", "absorbed/no-overlap", "auto", "auto/no-overlap"]
    assert [("ahead" in s["booked"]) for s in samples] == [True, False, True, False]
    # the same requests either way
    assert len({(s["prompt_tokens"], s["output_tokens"]) for s in samples}) == 1
    assert all(s["prefill_steps"] >= 1 and s["tokens_per_s"] > 0 for s in samples)
