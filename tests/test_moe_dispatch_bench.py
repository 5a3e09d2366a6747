"""bench/moe_dispatch.py's logic on CPU ranks with the tiny DeepSeek-V3 checkpoint (--smoke), so its
first run on two GPUs does not fail on a bug a CPU could have caught: both paths timed and compared,
floors from rates measured in the same run, and a comparison that fails turns the exit code to 1."""

from __future__ import annotations

import pytest
from bench_scripts import load_bench

from splash_core import results


def test_smoke_run_times_both_paths_beside_their_floors(rank_pools, tmp_path):
    bench = load_bench("moe_dispatch")
    args = bench.parse_args(["--smoke", "--out", str(tmp_path)])
    assert bench.run(args, rank_pools(2)) == 0
    data = results.read_result(tmp_path / "cpu" / "moe_dispatch.json")
    points = data["summary"]["points"]
    assert [p["rows"] for p in points] == [8, 32] and data["T"] == 2
    for p in points:
        assert p["all_reduce_ms"] > 0 and p["all_to_all_ms"] > 0 and not p["mismatch"]
        assert p["all_reduce_over_floor"] > 0 and p["all_to_all_over_floor"] > 0
    rates = data["summary"]["rates"]
    assert all(rates[k] > 0 for k in ("copy_gbps", "matmul_tflops", "all_gather_gbps", "all_to_all_gbps",
                                      "all_reduce_gbps", "collective_latency_us"))
    assert all(0 <= s["error"] <= args.tolerance and s["sent_rows"] >= 0 for s in data["samples"])


def test_a_bf16_run_passes_at_its_default_tolerance(rank_pools, tmp_path):
    """The two paths in bf16 differ by the format's rounding (0.005-0.007 of the largest value here),
    well inside the default 0.02; a NaN or a lost rank's sums would not be (tests/test_moe_all_to_all.py)."""
    bench = load_bench("moe_dispatch")
    args = bench.parse_args(["--smoke", "--dtype", "bf16", "--out", str(tmp_path)])
    assert args.tolerance == 0.02 and bench.run(args, rank_pools(2)) == 0
    errors = [s["error"] for s in results.read_result(tmp_path / "cpu" / "moe_dispatch.json")["samples"]]
    assert all(0 < e < 0.02 for e in errors), errors


def test_a_failed_comparison_fails_the_run(rank_pools, tmp_path):
    bench = load_bench("moe_dispatch")
    args = bench.parse_args(["--smoke", "--out", str(tmp_path), "--tolerance", "-1"])  # nothing is within it
    assert bench.run(args, rank_pools(2)) == 1
    assert all(p["mismatch"] for p in results.read_result(tmp_path / "cpu" / "moe_dispatch.json")["summary"]["points"])


def test_a_point_that_is_not_its_slowest_rank_is_refused(rank_pools, tmp_path):
    bench = load_bench("moe_dispatch")
    assert bench.run(bench.parse_args(["--smoke", "--out", str(tmp_path)]), rank_pools(2)) == 0
    data = results.read_result(tmp_path / "cpu" / "moe_dispatch.json").data
    data["summary"]["points"][0]["all_to_all_ms"] /= 2  # not the slowest rank's time
    with pytest.raises(results.ResultError, match="all_to_all_ms.*slowest rank"):
        results.validate(data, "planted")
