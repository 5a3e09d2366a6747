"""bench/runtime_step.py's logic on CPU with tiny shapes (--smoke), so its first GPU run does not
fail on a bug a CPU could have caught; and its memory planning."""

from __future__ import annotations

from bench_scripts import load_bench

from splash_bench.step import layers_that_fit
from splash_core import results
from splash_core.layouts import Layout
from splash_core.profiles.loader import load


def test_smoke_run_writes_valid_results(rank_pools, tmp_path):
    bench = load_bench("runtime_step")
    args = bench.parse_args(["--smoke", "--out", str(tmp_path)])
    assert bench.run(args, rank_pools(2)) == 0
    eq = results.read_result(tmp_path / "cpu" / "runtime_equivalence.json")
    assert eq["summary"]["passed"] and {s["layout"] for s in eq["samples"]} == {str(l) for l in Layout}
    steps = results.read_result(tmp_path / "cpu" / "runtime_step.json")
    points = {(p["layout"], p["phase"], p["context"]) for p in steps["summary"]["points"]}
    assert points == {(str(l), ph, c) for l in Layout for ph in ("decode", "prefill") for c in (48, 96)}
    assert all(len(s["step_ms"]) == args.reps and min(s["step_ms"]) > 0 for s in steps["samples"])
    assert steps["summary"]["layers"] == 3 and not steps["summary"]["skipped"]


def test_layers_that_fit_follow_the_busiest_layout():
    v3 = load("model", "deepseek-v3")
    budget = 120 * (1 << 30)
    fit, acc = layers_that_fit(v3, 2, 16, 131072, 64, 2, budget, 16)
    per_layer = acc["per_layer_bytes"]
    # TP replicates every history: 16 x 128K tokens x 576 channels x 2 bytes per layer, the most of any layout
    assert max(per_layer, key=per_layer.get) == "TP" and per_layer["TP"] > 16 * 131072 * 576 * 2
    used = acc["fixed_bytes"] + acc["transient_bytes"]
    assert used + fit * per_layer["TP"] <= budget < used + (fit + 1) * per_layer["TP"]
    assert layers_that_fit(v3, 2, 16, 1024, 64, 2, 10 ** 15, 16)[0] == v3.num_layers  # capped by the model


def test_calibrated_grid_feeds_the_cost_model_check(rank_pools, tmp_path):
    """The one GPU command's CPU dry run: `--calibrate` writes θ of this runtime beside a grid of
    batch sizes, and bench/costmodel_check.py predicts the grid with it, per layout and phase."""
    bench = load_bench("runtime_step")
    args = bench.parse_args(["--smoke", "--T", "1", "--batches", "1,3", "--calibrate", "--skip-equivalence",
                             "--out", str(tmp_path)])
    calibrated = bench.calibrate(args)
    assert bench.run(args, rank_pools(1), calibrated) == 0
    steps = results.read_result(tmp_path / "cpu" / "runtime_step.json")
    summary = steps["summary"]
    assert summary["calibrated_profile"] == "runtime_step-hardware.yaml" and summary["graphs"] == "auto"
    assert {(p["layout"], p["phase"], p["batch"], p["context"]) for p in summary["points"]} == {
        (str(l), ph, b, c) for l in Layout for ph in ("decode", "prefill") for b in (1, 3) for c in (48, 96)}
    assert {p["path"] for p in summary["points"]} == {"eager"}  # the host captures no graphs
    assert {p["rows"] for p in summary["points"] if p["phase"] == "prefill" and p["batch"] == 3} == {3 * args.prefill_chunk}
    profile = load("hardware", str(tmp_path / "cpu" / "runtime_step-hardware.yaml"))
    assert profile.attention_tflops.source == "measured" and "--graphs auto" in profile.layer_overhead_us[Layout.TP].command
    assert {s.phase for s in profile.step_samples if s.layers} == {"decode", "prefill"}

    check = load_bench("costmodel_check")
    assert check.main(["--measured", str(tmp_path / "cpu" / "runtime_step.json"), "--fit-context", "48",
                       "--out", str(tmp_path / "check")]) == 0
    out = results.read_result(tmp_path / "check" / "cpu" / "costmodel_check.json")["summary"]
    assert out["hardware"] == "runtime_step-hardware"  # calibrated in the same run, found beside the result
    names = [v["variant"] for v in out["variants"]]
    assert names[:2] == ["Eq 10 alone", check.AS_CALIBRATED]
    assert {(r["layout"], r["phase"]) for r in out["by_layout"] if r["variant"] == check.AS_CALIBRATED} == {
        (str(l), ph) for l in Layout for ph in ("decode", "prefill")}
    assert all(r["points"] == 2 for r in out["by_layout"])  # held out: both batch sizes at context 96
