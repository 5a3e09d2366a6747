"""bench/runtime_step.py's logic on CPU with tiny shapes (--smoke), so its first GPU run does not
fail on a bug a CPU could have caught; and its memory planning."""

from __future__ import annotations

from bench_scripts import load_bench
from splash_core import results
from splash_core.layouts import Layout
from splash_core.profiles.loader import load
from splash_bench.step import layers_that_fit


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
