"""Valid example results of every benchmark shape (docs/results.md), for the results and
report tests. Numbers are chosen so the report's formats show them exactly."""

from __future__ import annotations

import copy
from pathlib import Path

from splash_core.result_shapes import switch_overhead_summary
from splash_core.results import make_result, write_result

SWEEP = [  # (layout, input_tokens, tokens/s): TP leads at 1K, DP at 4K, DOP at 16K
    ("TP", 1024, 900), ("CP", 1024, 700), ("DP", 1024, 800), ("DOP", 1024, 750),
    ("TP", 4096, 1500), ("CP", 4096, 1700), ("DP", 4096, 2100), ("DOP", 4096, 2000),
    ("TP", 16384, 1800), ("CP", 16384, 2600), ("DP", 16384, 2500), ("DOP", 16384, 3100),
]
SWITCH_RUNS = {  # (src, dst) -> (ready, blocking, splash) ms of three matched runs
    ("TP", "CP"): [(100.0, 140.0, 101.0), (102.0, 150.0, 102.5), (101.0, 145.0, 101.25)],
    ("CP", "DOP"): [(80.0, 120.0, 80.5), (81.0, 125.0, 81.5), (79.0, 119.0, 79.5)],
}


def examples() -> dict[str, tuple[dict, list]]:
    """benchmark -> (summary, samples) of a small valid measured result."""
    sweep = "Input-length sweep, B = 4"
    switch_samples = [{"src": s, "dst": d, "ready_ms": r, "blocking_ms": b, "splash_ms": p, "run": i}
                      for (s, d), runs in SWITCH_RUNS.items() for i, (r, b, p) in enumerate(runs)]
    costs = [{"state": "weights", "src": "TP", "dst": "CP", "per_layer_ms": 0.125, "bytes": 2_000_000,
              "primitive": "all_gather"},
             {"state": "kv", "src": "CP", "dst": "DOP", "per_layer_ms": 1.5, "per_layer_ms_p95": 1.75,
              "bytes": 6_000_000, "primitive": "all_to_all"},
             {"state": "kv", "src": "TP", "dst": "DP", "per_layer_ms": 0.0, "bytes": 0, "primitive": "discard"}]
    return {
        "fixed_layout_sweep": (
            {"output_tokens": 16, "points": [{"sweep": sweep, "layout": l, "batch": 4, "input_tokens": n,
                                               "tokens_per_s": float(v), "runs": 2} for l, n, v in SWEEP]},
            [{"sweep": sweep, "layout": l, "batch": 4, "input_tokens": n, "tokens_per_s": float(v)}
             for l, n, v in SWEEP for _ in range(2)]),
        "primitive_costs": ({"workload": "B=4, 2K context", "costs": costs},
                            [{k: c[k] for k in ("state", "src", "dst", "per_layer_ms")} for c in costs]),
        "switch_overhead": ({"workload": "B=4, 2K context", "directions": switch_overhead_summary(switch_samples)},
                            switch_samples),
        "kv_capacity": (
            {"memory_fraction": 0.5, "layouts": [
                {"layout": "TP", "pool_bytes_per_rank": 3 << 30, "pool_bytes_per_group": 6 << 30, "distinct_tokens": 1000},
                {"layout": "DP", "pool_bytes_per_rank": 2 << 30, "distinct_tokens": 1600},
                {"layout": "DOP", "pool_bytes_per_rank": 5 << 29, "distinct_tokens": 2400}]},
            [{"layout": "TP", "pool_bytes_per_rank": 3 << 30, "distinct_tokens": 1000}]),
        "mla_decode": (
            {"copy_gbps": 30.0, "points": [
                {"kernel": "torch", "batch": 1, "context": 4096, "time_ms": 0.5, "achieved_gbps": 12.5},
                {"kernel": "torch", "batch": 1, "context": 8192, "time_ms": 0.9, "achieved_gbps": 15.0}]},
            [{"kernel": "torch", "batch": 1, "context": 4096, "time_ms": 0.5}]),
        "prefill": (
            {"matmul_tflops": 0.2, "points": [
                {"kernel": "torch", "batch": 1, "input_tokens": 512, "time_ms": 4.0, "achieved_tflops": 0.1}]},
            [{"kernel": "torch", "batch": 1, "input_tokens": 512, "time_ms": 4.0}]),
        "plan_speed": ({"cases": [{"case": "plan TP->CP, 16 requests", "p50_us": 250.5, "p95_us": 300.25, "runs": 50}]},
                       [{"case": "plan TP->CP, 16 requests", "us": 250.5}]),
        "scheduler_speed": ({"cases": [{"case": "decide, 256 running", "p50_us": 80.0, "p95_us": 95.5, "runs": 100}]},
                            [{"case": "decide, 256 running", "us": 80.0}]),
        "rollout_serving": (
            {"workload": "rollout-tiny", "output_tokens": 200, "best_fixed": "TP", "splash_over_best_fixed": 1.25,
             "policies": [
                 {"policy": "SPLASH", "tokens_per_s": 1250.0, "elapsed_s": 1.5, "steps": 64, "switches": 1,
                  "served": 12, "layout_steps": "TP 13, CP 51"},
                 {"policy": "TP", "tokens_per_s": 1000.0, "elapsed_s": 1.875, "steps": 64, "switches": 0,
                  "served": 12, "layout_steps": "TP 64"},
                 {"policy": "CP", "tokens_per_s": 800.0, "elapsed_s": 2.5, "steps": 64, "switches": 0,
                  "served": 12, "layout_steps": "CP 64"}]},
            [{"policy": "SPLASH", "tokens_per_s": 1250.0}, {"policy": "TP", "tokens_per_s": 1000.0},
             {"policy": "CP", "tokens_per_s": 800.0}]),
        "crossovers": ({"axis": "input_tokens", "batch": 4, "scenario": "profiles/deployments/cpu-tiny.yaml",
                        "predicted": [{"at": 2000.0, "from": "TP", "to": "DP"},
                                      {"at": 20000.0, "from": "DP", "to": "DOP"}]}, []),
    }


def make(benchmark: str, platform: str = "cpu", **overrides) -> dict:
    """A valid result of ``benchmark`` (crossovers come from the cost model, others measured)."""
    summary, samples = copy.deepcopy(examples()[benchmark])
    fields = dict(benchmark=benchmark, platform=platform, backend="reference", model="tiny-mla", T=2,
                  dtype="fp32", samples=samples, summary=summary, machine="test machine", command="pytest",
                  source="model" if benchmark == "crossovers" else "measured")
    fields.update(overrides)
    return make_result(**fields)


def write_all(root: Path, platform: str = "cpu") -> list[Path]:
    return [write_result(make(b, platform), root) for b in examples()]
