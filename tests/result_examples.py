"""Valid example results of every benchmark shape (docs/results.md), for the results and
report tests. Numbers are chosen so the report's formats show them exactly."""

from __future__ import annotations

import copy
from pathlib import Path

from splash_bench.switch_summary import switch_overhead_summary
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
        "precopy_planning": ({"cases": [{"case": "policy", "p50_us": 300.0, "p95_us": 13000.0, "runs": 3}]},
                             [{"case": "policy", "us": 300.0, "window": 1, "step": 0}]),
        "sampling_speed": ({"cases": [{"case": "device: 16 rows, temperature 1", "p50_us": 900.0, "p95_us": 950.0,
                                        "runs": 2}]},
                           [{"case": "device: 16 rows, temperature 1", "us": 900.0, "rep": 0}]),
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
        "switch_host_profile": (
            {"workload": "B=16, 32K context, page 64, tiny widths", "layers": 8, "directions": [
                {"src": "CP", "dst": "TP", "ready_p50_ms": 300.0, "splash_p50_ms": 305.5, "overhead_p50_ms": 5.5,
                 "switch_host_p50_ms": 9.5, "prepare_p50_ms": 0.5, "bookkeeping_per_layer_us": 250.0,
                 "warm_bookkeeping_per_layer_us": 125.0, "data_p50_ms": 7.0, "runs": 2}]},
            [{"src": "CP", "dst": "TP", "ready_ms": 300.0, "splash_ms": 305.5, "bookkeeping_ms": 2.0, "run": 0}]),
        "precopy_step": (
            {"workload": "B=16, 32K context, page 64, tiny widths", "layers": 8, "directions": [
                {"src": "DP", "dst": "TP", "ordinary_p50_ms": 150.0, "precopy_p50_ms": 162.5, "handoff_p50_ms": 240.0,
                 "one_step_p50_ms": 330.0, "precopy_extra_p50_ms": 12.5, "precopy_host_p50_ms": 15.5,
                 "handoff_kv_bytes": 1 << 20, "one_step_kv_bytes": 16 << 20, "paused_steps": 0, "runs": 5}]},
            [{"src": "DP", "dst": "TP", "run": 0, "kind": "ordinary", "step": 0, "wall_ms": 150.0}]),
        "crossovers": ({"axis": "input_tokens", "batch": 4, "scenario": "profiles/deployments/cpu-tiny.yaml",
                        "predicted": [{"at": 2000.0, "from": "TP", "to": "DP"},
                                      {"at": 20000.0, "from": "DP", "to": "DOP"}]}, []),
        "runtime_host_profile": (
            {"workload": "B=4, 64-token histories in 16-token pages", "layers": 3, "baseline": "commit abc1234",
             "points": [{"layout": l, "phase": ph, "runtime_us": 900.0, "first_layer_us": 1000.0, "kernel_us": 500.0,
                         "collective_us": 50.0, "step_ms": 5.0, "aten_ops": 90, "host_copies": 0, "step_copies": 5,
                         "host_reads": 0, "collectives": 2, "before_runtime_us": 1200.0,
                         "before_first_layer_us": 1300.0, "before_step_ms": 6.0, "before_aten_ops": 144,
                         "before_host_copies": 1, "before_step_copies": 13, "before_host_reads": 0,
                         "before_collectives": 2} for l in ("TP", "CP") for ph in ("decode", "prefill")]},
            [{"layout": "TP", "phase": "decode", "rep": 0, "runtime_us": 900.0, "step_ms": 5.0}]),
        **device_examples(),
    }


STEP_MS = {  # (layout, phase, context) -> three step times (ms); medians 10.0, 12.5, ...
    ("TP", "decode", 1024): [10.0, 11.0, 9.0], ("CP", "decode", 1024): [14.0, 12.0, 13.0],
    ("TP", "decode", 4096): [12.5, 12.0, 13.0], ("CP", "decode", 4096): [11.0, 11.5, 10.0],
    ("TP", "prefill", 1024): [20.0, 21.0, 22.0], ("CP", "prefill", 1024): [25.0, 24.0, 26.0],
}


def device_examples() -> dict[str, tuple[dict, list]]:
    """The device benchmarks' examples: correctness, equivalence, conformance, tuning, step times."""
    mla_checks = [{"config": "generic", "heads": 16, "kernel": "decode", "case": "short", "ok": True,
                   "max_abs_err_out": 0.001953125, "max_abs_err_lse": 9.5367431640625e-07},
                  {"config": "generic", "heads": 16, "kernel": "decode", "case": "long", "ok": True,
                   "max_abs_err_out": 0.00048828125, "max_abs_err_lse": 1.9073486328125e-06},
                  {"config": "generic", "heads": 16, "kernel": "pack/unpack", "ok": True},
                  {"config": "wide", "heads": 128, "kernel": "decode", "case": "short", "ok": False,
                   "max_abs_err_out": 0.25, "max_abs_err_lse": 0.125},
                  {"config": "wide", "heads": 128, "kernel": "pack/unpack", "ok": False}]
    equivalence = [{"model": "tiny-mla", "layout": l, "max_abs_err": 0.0375, "ref_scale": 5.0, "rel_err": 0.0075,
                    "tolerance": 0.05, "greedy_mismatches": m, "decisive_mismatches": 0, "steps": 24, "passed": True}
                   for l, m in (("TP", 0), ("DOP", 2))]
    step_points = [{"layout": l, "phase": ph, "context": c, "batch": 4, "rows": 4 if ph == "decode" else 32,
                    "median_ms": sorted(ts)[1]} for (l, ph, c), ts in STEP_MS.items()]
    step_samples = [{**{k: p[k] for k in ("layout", "phase", "context", "batch", "rows")}, "layers": 3,
                     "step_ms": STEP_MS[(p["layout"], p["phase"], p["context"])]} for p in step_points]
    sweep = {"points": [[16, 4096], [64, 4096]], "heads": 16, "candidates": 3, "failed": 1, "skipped": 0,
             "winner": "r1h16k64", "winner_ms": [0.5, 1.5], "winner_rates": [{"kv_gbps": 24.0, "tflops": 0.75},
                                                                            {"kv_gbps": 27.0, "tflops": 0.8}],
             "previous_ms": [1.0, 2.25], "previous_rates": [{"kv_gbps": 12.0, "tflops": 0.375},
                                                            {"kv_gbps": 18.0, "tflops": 0.5}],
             "speedup_vs_previous": [2.0, 1.5]}
    return {
        "mla_correctness": ({"checks": 5, "failed": 2, "all_ok": False}, mla_checks),
        "kda_correctness": ({"checks": 2, "failed": 0, "all_ok": True},
                            [{"kernel": "kda.chunk", "ok": True, "rel_err_out": 0.00390625, "rel_err_state": 0.0078125},
                             {"kernel": "kda.step", "ok": True, "rel_err_out": 0.001953125, "rel_err_state": 0.0}]),
        "runtime_equivalence": ({"passed": True, "failed": [], "tolerance": 0.05, "kernels": "backend"}, equivalence),
        "conformance": ({"reference": True, "other": False},
                        [{"backend": "reference", "returncode": 0, "summary": "18 passed, 2 skipped in 12.50s",
                          "command": "-m pytest --pyargs splash_core.testing --splash-backend reference "
                                     "--splash-ranks 2"},
                         {"backend": "other", "returncode": 1, "summary": "17 passed, 1 failed, 2 errors in 3.00s"}]),
        "gpu_rates": ({"copy_gbps": 30.0, "matmul_tflops": 1.5}, [{"copy_gbps": 30.0, "matmul_tflops": 1.5}]),
        "mla_kernel_sweep": (
            {"tiles": {"decode": "r1h16k64", "extend": "r4h16k32"},
             "workloads": {"decode-h16": sweep, "extend-h16": {"points": [[256, 2048]], "heads": 16, "candidates": 1,
                                                                "failed": 1, "skipped": 0}},
             "previous_config": {"name": "cpu-default"}, "tuned_file": "tuned.json"},
            [{"workload": "decode-h16", "kernel": "previous (abc1234)", "tile": "r1h16k32", "ms": [1.0, 2.25]},
             {"workload": "decode-h16", "kernel": "current", "tile": "r1h16k64", "ms": [0.5, 1.5]},
             {"workload": "extend-h16", "kernel": "current", "tile": "r4h16k32", "error": "does not fit"}]),
        "decode_step": (
            {"rates": {"copy_gbps": 4000.0, "matmul_tflops": 700.0, "copy_mib": 2048, "matmul_n": 8192},
             "layers": {"1": 61, "16": 31}, "memory": {"1": {"layers_fit": 61}, "16": {"layers_fit": 31}},
             "points": [{"batch": b, "context": 8192, "layers": 3, "eager_ms": 2.0, "eager_device_ms": 0.5,
                         "graph_ms": 1.0, "replay_ms": 0.8, "roofline_ms": 0.4, "capture_s": 0.2,
                         "graph_bytes": 1 << 20, "captured": True, "tokens_match": True, "decisive_mismatches": 0,
                         "wall_over_replay": 1.25,
                         "eager_over_graph": 2.0, "replay_over_roofline": 2.0} for b in (1, 16)],
             "skipped": ["B=16/131072"]},
            [{"batch": b, "context": 8192, "layers": 3, "layout": "TP", "path": path, "wall_ms": [ms - 0.5, ms + 0.5]}
             for b in (1, 16) for path, ms in (("eager", 2.0), ("graph", 1.0))]
            + [{"batch": b, "context": 8192, "layers": 3, "layout": "TP", "path": "roofline", "roofline_ms": 0.4}
               for b in (1, 16)]),
        "dsa_step": (
            {"rates": {"copy_gbps": 3000.0, "matmul_tflops": 700.0, "copy_mib": 2048, "matmul_n": 8192},
             "points": [{"cache": "bf16", "phase": "decode", "context": 32768, "rows": 16, "provider": p,
                         "finite": True, "ms": 2.0, "roofline_ms": 0.5, "over_roofline": 4.0}
                        for p in ("dense", "triton")]
             + [{"cache": "bf16", "context": 32768, "provider": "flashmla", "error": "RuntimeError: not here"}],
             "skipped": [], "sparse_providers": {"bf16": {"provider": "triton", "points": 1, "flashmla_faster": 0}}},
            [{"cache": "bf16", "sparse": p != "dense", "provider": p, "phase": "decode", "context": 32768,
              "wall_ms": [1.5, 2.0, 2.5], "roofline_ms": 0.5} for p in ("dense", "triton")]
            + [{"cache": "bf16", "sparse": True, "provider": "flashmla", "context": 32768, "error": "not here"}]),
        "fp8_gemm": (
            {"peaks": {"bf16_tflops": 700.0, "fp8_tflops": 1400.0},
             "points": {"q_a/m16": {"triton_tflops": 30.0, "bf16_tflops": 29.0}}},
            [{"shape": "q_a", "m": 16, "n": 1536, "k": 7168, "triton_tflops": 30.0, "bf16_ms": [0.01, 0.012]}]),
        "moe_dispatch": (
            {"rates": {"copy_gbps": 3000.0, "matmul_tflops": 700.0, "copy_mib": 2048, "matmul_n": 8192,
                       "all_gather_gbps": 250.0, "all_to_all_gbps": 260.0, "all_reduce_gbps": 290.0,
                       "collective_latency_us": 30.0},
             "points": [{"rows": 2048, "all_reduce_ms": 2.0, "all_to_all_ms": 2.5, "all_reduce_floor_ms": 1.0,
                         "all_to_all_floor_ms": 1.25, "all_reduce_over_floor": 2.0, "all_to_all_over_floor": 2.0,
                         "faster": "all_reduce", "rule_dispatches": False, "mismatch": []}],
             "hardware_rule": "h200"},
            [{"rank": r, "rows": 2048, "ms": {"all_reduce": 2.0 - r / 2, "all_to_all": 2.5 - r}, "error": 0.001,
              "sent_rows": 700, "pairs_here": 8000} for r in range(2)]),
        "runtime_step": ({"layers": 3, "layers_fit": 5,
                          "memory": {"per_layer_bytes": {"TP": 3 << 29, "CP": 1 << 29}, "fixed_bytes": 1 << 30,
                                     "transient_bytes": 1 << 29, "budget_bytes": 8 << 30},
                          "points": step_points, "skipped": ["CP/prefill/4096"]}, step_samples),
        "costmodel_check": (
            {"measured_file": "bench/results/cpu/runtime_step.json", "hardware": "cpu", "layers": 3,
             "fit": "decode at 1024 tokens", "step_overhead_us": 500.0,
             "variants": [{"variant": "Eq 10 alone", "decode_mean_abs_error_pct": 50.0,
                           "decode_max_abs_error_pct": 60.0, "prefill_mean_abs_error_pct": 40.0,
                           "prefill_max_abs_error_pct": 45.0, "mean_regret_pct": 10.0, "max_regret_pct": 20.0,
                           "cases": 2},
                          {"variant": "host hidden", "host_overlap": 1.0, "decode_mean_abs_error_pct": 5.0,
                           "decode_max_abs_error_pct": 6.0, "prefill_mean_abs_error_pct": 12.5,
                           "prefill_max_abs_error_pct": 15.0, "mean_regret_pct": 0.0, "max_regret_pct": 0.0,
                           "cases": 2}],
             "overheads": [{"variant": "host hidden", "layout": l, "layer_overhead_us": 250.0 * (i + 1)}
                           for i, l in enumerate(("TP", "CP", "DP", "DOP"))],
             "points": [{"variant": v, "layout": "TP", "phase": ph, "context": c, "role": r, "measured_ms": 10.0,
                         "predicted_ms": p, "error_pct": 10.0 * (p - 10.0)}
                        for v, p in (("Eq 10 alone", 5.0), ("host hidden", 9.5))
                        for ph, c, r in (("decode", 1024, "fit"), ("decode", 4096, "check"),
                                         ("prefill", 1024, "check"))]}, []),
        "copy_interference": (
            {"workload": "B=4, 1K context, 2 layers", "rows": [
                {"variant": v, "mib_per_layer": 1.0, "step_alone_ms": 10.0, "step_ms": 10.0 + d, "slowdown_ms": d,
                 "slowdown_pct": 10.0 * d, "slowdown_ms_per_gib": 512.0 * d, "copy_alone_ms": 0.25,
                 "copies_per_layer": n} for v, d, n in (("kernels", 1.0, 2), ("memcpy", 0.5, 4))]},
            [{"variant": v, "mib": m, "run": 0, "step_ms": t, "copy_alone_ms": c, "bytes_per_layer": b,
              "copies_per_layer": n}
             for v, m, t, c, b, n in (("alone", 0.0, 10.0, 0.0, 0, 0), ("kernels", 1.0, 11.0, 0.25, 1 << 20, 2),
                                      ("memcpy", 1.0, 10.5, 0.25, 1 << 20, 4))]),
        "page_runs": (
            {"page_bytes": 73728, "min_run_bytes": 4194304.0, "rows": [
                {"scenario": "rollout", "pool": "roomy", "pool_pages": 512, "peak_used_pages": 300, "step": s,
                 "requests": n, "pages": p, "runs": n, "plain_runs": n, "pages_per_run": p / n,
                 "median_request_pages_per_run": p / n, "worst_request_pages_per_run": p / n - 1, "pulled": True}
                for s, n, p in ((100, 4, 240), (200, 2, 180))]},
            [{"scenario": "rollout", "pool": "roomy", "step": s, "per_request": [[60, 1, 1]] * n}
             for s, n in ((100, 4), (200, 2))]),
        "served_bench": (
            {"server_command": "splash serve --deployment d.yaml --port 1234", "server_ready_s": 60.0,
             "server_exit_code": 0, "workload": {"num_prompts": 2, "input_tokens": [1024, 8192], "output_tokens": 256},
             "skipped": ["rate 1: expected 128 s, 90 s of the budget left"],
             "runs": [{"rate": r, "seconds": 30.0, "command": "python -m sglang.bench_serving ...", "completed": 2,
                       "metrics": 'splash_switches_total{dst="DP",src="TP"} 3.0\n', "server_info": {"layout": "TP"},
                       "bench_serving": {"request_throughput": 0.5, "output_throughput": 17.0, "median_ttft_ms": t,
                                         "p99_ttft_ms": 2 * t, "median_itl_ms": 20.0, "p99_itl_ms": 31.0,
                                         "median_e2e_latency_ms": 5100.0 + t, "p99_e2e_latency_ms": 5200.0 + t}}
                      for r, t in (("4", 310.0), ("inf", 900.0))]},
            [{"rate": r, "request": i, "input_tokens": 2048, "output_tokens": 256, "ttft_ms": 300.0, "itl_ms": [20.0],
              "error": None} for r in ("4", "inf") for i in range(2)]),
        "peer_kernels": (
            {"kernels": {"splash": {"what": "triton:h200", "correct": True, "max_abs_err": 0.004},
                         "flashmla": {"what": "sgl-flash-mla 1.0.0", "correct": True, "max_abs_err": 0.004},
                         "sglang": {"what": "sglang", "skipped": "ImportError: no sglang"}},
             "rates": {"copy_gbps": 4200.0, "matmul_tflops": 780.0},
             "providers": {"128": {"flashmla_from_kv_tokens": 524288, "points": 1,
                                   "flashmla_faster_at": [[16, 32768]]}},
             "providers_fp8": {"128": {"flashmla_from_kv_tokens": 524288, "points": 1,
                                       "flashmla_faster_at": [[16, 32768]]}},
             "kernels_fp8": {"splash": {"what": "triton:h200", "correct": True, "max_abs_err": 0.004},
                             "flashmla": {"what": "sgl-flash-mla 1.0.0", "correct": True, "max_abs_err": 0.004}}},
            [{"kernel": k, "batch": 16, "heads": 128, "context": 32768, "ms": t, "kv_gbps": 1e3 / t,
              "tflops": 200.0 / t, "vs_flashmla": t / 0.23} for k, t in (("splash", 0.67), ("flashmla", 0.23))]
            + [{"kernel": k, "kv": "fp8", "batch": 16, "heads": 128, "context": 32768, "ms": t, "kv_gbps": 6e2 / t,
                "tflops": 200.0 / t, "vs_flashmla": t / 0.2} for k, t in (("splash", 0.6), ("flashmla", 0.2))]),
    }


def make(benchmark: str, platform: str = "cpu", **overrides) -> dict:
    """A valid result of ``benchmark`` (crossovers and costmodel_check come from the cost model,
    others measured)."""
    summary, samples = copy.deepcopy(examples()[benchmark])
    fields = dict(benchmark=benchmark, platform=platform, backend="reference", model="tiny-mla", T=2,
                  dtype="fp32", samples=samples, summary=summary, machine="test machine", command="pytest",
                  source="model" if benchmark in ("crossovers", "costmodel_check") else "measured")
    fields.update(overrides)
    return make_result(**fields)


def write_all(root: Path, platform: str = "cpu") -> list[Path]:
    return [write_result(make(b, platform), root) for b in examples()]
