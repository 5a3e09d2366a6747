"""bench/engine_bench.py's logic on CPU (--smoke: the tiny model, a small rollout and two sweep
points), so its GPU run does not fail on a bug a CPU could have caught."""

from __future__ import annotations

from bench_scripts import load_bench

from splash_core import results


def test_smoke_run_writes_valid_rollout_and_sweep_results(rank_pools, tmp_path):
    bench = load_bench("engine_bench")
    args = bench.parse_args(["--smoke", "--out", str(tmp_path)])
    assert bench.run(args, rank_pools(2)) == 0
    rollout = results.read_result(tmp_path / "cpux2" / "rollout_serving.json")
    policies = {r["policy"]: r for r in rollout["summary"]["policies"]}
    assert set(policies) == {"SPLASH", "TP", "CP", "DP", "DOP"}
    # whether SPLASH switches follows the calibrated CPU profile (its host overheads make TP fastest here)
    assert all(policies[l]["switches"] == 0 for l in ("TP", "CP", "DP", "DOP"))
    assert len({r["served"] for r in policies.values()}) == 1  # every policy serves the same requests
    best = max((p for p in policies if p != "SPLASH"), key=lambda p: policies[p]["tokens_per_s"])
    assert rollout["summary"]["best_fixed"] == best
    assert rollout["summary"]["splash_over_best_fixed"] == policies["SPLASH"]["tokens_per_s"] / policies[best]["tokens_per_s"]
    assert "outputs equal to the single-device reference" in rollout["notes"]
    # two rounds (--smoke), in alternating order; per policy the lower median (here: the slower) run
    assert sorted({(s["round"], s["policy"]) for s in rollout["samples"]}) == sorted(
        (r, p) for r in (1, 2) for p in policies)
    assert "median throughput over 2 rounds" in rollout["notes"]
    for p in policies:
        assert policies[p]["tokens_per_s"] == min(s["tokens_per_s"] for s in rollout["samples"] if s["policy"] == p)
    sweep = results.read_result(tmp_path / "cpux2" / "fixed_layout_sweep.json")
    points = {(p["layout"], p["batch"], p["input_tokens"]) for p in sweep["summary"]["points"]}
    assert points == {(l, 4, n) for l in ("TP", "CP", "DP", "DOP") for n in (64, 160)}
    assert sweep["summary"]["output_tokens"] == 4 and "instead of 1,024" in sweep["notes"]


def test_a_run_past_the_budget_is_skipped_and_listed(rank_pools, tmp_path):
    bench = load_bench("engine_bench")
    args = bench.parse_args(["--smoke", "--out", str(tmp_path), "--budget-s", "0"])
    assert bench.run(args, rank_pools(2)) == 0
    assert not (tmp_path / "cpux2").exists()  # nothing ran, nothing written
