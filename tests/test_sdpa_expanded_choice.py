"""Which provider serves the expanded form on the hopper backend: the ``expanded`` entry of its measured
table (``bench/expanded_attention.py --write-providers``), SDPA from a measured number of query rows
per head count, Triton where nothing was measured; and the benchmark's CPU path writing that entry."""

from __future__ import annotations

import json
import shutil

from splash_backend_hopper import plugin, providers

from splash_core.kernels import triton_mla_kernels
from splash_core.kernels.expanded_buckets import BucketSizes
from splash_core.kernels.expanded_choice import ExpandedChoice
from splash_core.kernels.expanded_sdpa import _fused_cudnn


def table(**heads):
    return {"expanded": {"heads": {str(h): {"sdpa_from_rows": rows} for h, rows in heads.items()}}}


def test_measured_table_picks_sdpa_per_head_count_from_its_threshold():
    t = {"expanded": {"heads": {"16": {"sdpa_from_rows": None}, "128": {"sdpa_from_rows": 8192}}}}
    assert [providers.expanded_provider(h, 8192, t) for h in (8, 16, 64, 128, 256)] == [
        "triton", "triton", "triton", "sdpa", "sdpa"]
    assert providers.expanded_provider(128, 8191, t) == "triton"  # a smaller call stays on Triton
    assert providers.expanded_provider(128, 1 << 20, {}) == "triton"  # nothing measured
    assert providers.sdpa_somewhere(t) and not providers.sdpa_somewhere({}) and not providers.sdpa_somewhere(
        {"expanded": {"heads": {"128": {"sdpa_from_rows": None}}}})


def test_thresholds_start_where_sdpa_wins_every_larger_point():
    def point(rows, triton, sdpa, heads=128):
        return {"heads": heads, "rows": rows, "triton_ms": triton, "sdpa_ms": sdpa}

    points = [point(512, 0.1, 0.3), point(2048, 1.0, 0.9), point(8192, 4.0, 4.5),  # a loss at 8K ...
              point(16384, 9.0, 5.0), point(65536, 40.0, 20.0), point(65536, 60.0, 30.0),  # ... wins from 16K
              point(8192, 1.0, None, heads=16)]  # SDPA failed: Triton
    got = providers.expanded_thresholds(points)
    assert got["128"] == {"sdpa_from_rows": 16384, "points": 6, "sdpa_faster_at_rows": [2048, 16384, 65536, 65536]}
    assert got["16"]["sdpa_from_rows"] is None


def test_backend_wraps_the_expanded_form_only_where_sdpa_was_chosen(monkeypatch):
    kernels = triton_mla_kernels()
    monkeypatch.setattr(providers, "load", lambda: table(**{"128": None}))
    assert plugin.with_expanded_choice(kernels) is kernels
    monkeypatch.setattr(providers, "load", lambda: table(**{"128": 8192}))
    chosen = plugin.with_expanded_choice(kernels)
    assert isinstance(chosen.expanded, ExpandedChoice) and chosen.name.endswith("+sdpa-expanded")
    names = dict(chosen.expanded.providers)
    assert names["triton"] is kernels.expanded
    assert names["sdpa"].attend is _fused_cudnn and names["sdpa"].fallback is kernels.expanded
    assert names["sdpa"].buckets is None  # measured without buckets: exact shapes
    assert chosen.expanded.provider(128, 8192) is names["sdpa"]
    assert chosen.expanded.provider(128, 100) is names["triton"]
    measured = table(**{"128": 8192})
    measured["expanded"]["buckets"] = {"granularity": 2048, "smallest_rows": 256, "row_step": 1024}
    monkeypatch.setattr(providers, "load", lambda: measured)
    sdpa = dict(plugin.with_expanded_choice(kernels).expanded.providers)["sdpa"]
    assert sdpa.buckets == BucketSizes(2048, 256, 1024) and "shape buckets" in providers.describe_expanded()


def test_benchmark_smoke_run_writes_the_expanded_entry_keeping_the_others(tmp_path):
    from bench_scripts import load_bench

    from splash_core.results import read_result

    path = tmp_path / "providers.json"
    shutil.copy(providers.PROVIDERS, path)
    before = json.loads(path.read_text())
    bench = load_bench("expanded_attention")
    assert bench.main(["--smoke", "--out", str(tmp_path), "--write-providers", str(path)]) == 0
    result = read_result(tmp_path / "cpu" / "expanded_attention.json")
    checks = result.data["summary"]["provider_correctness"]
    assert set(checks) == {"triton", "sdpa", "sdpa_per_request"} and all(c["correct"] for c in checks.values())
    samples = result.data["samples"]
    assert all(s["sdpa_ms"] > 0 and s["flops"] == s["visible_pairs"] * 2 * 40 * s["heads"] for s in samples)
    assert all(("sdpa_per_request_ms" in s) == (s["batch"] > 1) for s in samples)
    after = json.loads(path.read_text())
    assert {k: v for k, v in after.items() if k != "expanded"} == {k: v for k, v in before.items() if k != "expanded"}
    assert after["expanded"]["heads"] == result.data["summary"]["expanded_choice"]
    assert set(after["expanded"]["heads"]) == {str(s["heads"]) for s in samples}
    assert providers.load.__wrapped__(path)["expanded"] == after["expanded"]  # the backend reads it back


def test_benchmark_smoke_run_with_buckets_records_them_for_the_backend(tmp_path, monkeypatch):
    """``--buckets``: the bucketed provider is checked, warmed up (its shapes counted) and timed, the
    choice weighs it against Triton, and the entry names its buckets, which the backend then builds."""
    from bench_scripts import load_bench

    from splash_core.results import read_result

    path = tmp_path / "providers.json"
    shutil.copy(providers.PROVIDERS, path)
    bench = load_bench("expanded_attention")
    assert bench.main(["--smoke", "--buckets", "--out", str(tmp_path), "--write-providers", str(path)]) == 0
    summary = read_result(tmp_path / "cpu" / "expanded_attention.json").data["summary"]
    assert summary["provider_correctness"]["sdpa_buckets"]["correct"] and summary["chosen_sdpa"] == "sdpa_buckets"
    assert summary["warm_up"]["shapes"] > 0 and summary["buckets"] == {"granularity": 16, "smallest_rows": 4,
                                                                        "row_step": 8}
    written = providers.load.__wrapped__(path)
    assert written["expanded"]["buckets"] == summary["buckets"]
    monkeypatch.setattr(providers, "load", lambda: written)
    sdpa = dict(plugin.with_expanded_choice(triton_mla_kernels()).expanded.providers)["sdpa"]
    assert sdpa.buckets == BucketSizes(16, 4, 8)
