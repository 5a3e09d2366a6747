"""bench/decode_step.py's logic on the CPU reference with tiny shapes (--smoke), so its one GPU
call does not fail on a bug a CPU could have caught."""

from __future__ import annotations

from bench_scripts import load_bench

from splash_core import results


def test_smoke_run_writes_valid_results(rank_pools, tmp_path):
    bench = load_bench("decode_step")
    args = bench.parse_args(["--smoke", "--out", str(tmp_path)])
    assert bench.run(args, rank_pools(1)) == 0  # graph and eager agree on every point's tokens
    got = results.read_result(tmp_path / "cpu" / "decode_step.json")
    points = got["summary"]["points"]
    assert [(p["batch"], p["context"]) for p in points] == [(b, c) for b in (1, 4) for c in (48, 96)]
    assert all(p["tokens_match"] and not p["captured"] and p["roofline_ms"] > 0 for p in points)
    paths = {(s["batch"], s["context"], s["path"]) for s in got["samples"]}
    assert paths == {(b, c, p) for b in (1, 4) for c in (48, 96) for p in ("eager", "eager_unfused", "graph", "roofline")}
    timed = [s for s in got["samples"] if "wall_ms" in s]
    assert timed and all(len(s["wall_ms"]) == args.reps for s in timed)
    graph = [s for s in got["samples"] if s["path"] == "graph"]
    # the smoke's tables start one page wide: the longer context widened them and captured again
    assert graph[0]["table_width"] < graph[1]["table_width"] and all(s["max_logit_diff"] < 1e-4 for s in graph)


def test_smoke_run_with_fp8_mlp_weights(rank_pools, tmp_path):
    """--ffn-weights fp8: the dense MLP kept FP8 as stored, its file named apart, its roofline
    counting those weights at one byte a parameter (fewer bytes than the bf16-sized run's)."""
    bench = load_bench("decode_step")
    args = bench.parse_args(["--smoke", "--out", str(tmp_path), "--batches", "4", "--contexts", "48"])
    assert bench.run(args, rank_pools(1)) == 0
    args = bench.parse_args(["--smoke", "--out", str(tmp_path), "--batches", "4", "--contexts", "48",
                             "--ffn-weights", "fp8"])
    assert bench.run(args, rank_pools(1)) == 0
    plain, kept = (results.read_result(tmp_path / "cpu" / f"{name}.json") for name in ("decode_step", "decode_step-fp8"))
    assert kept["summary"]["ffn_weights"] == "fp8" and plain["summary"]["ffn_weights"] == "compute"
    bytes_of = [next(s["weight_bytes"] for s in r["samples"] if s["path"] == "roofline") for r in (plain, kept)]
    assert 0 < bytes_of[1] < bytes_of[0]
    assert kept["summary"]["points"][0]["tokens_match"]
