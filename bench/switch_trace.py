#!/usr/bin/env python
"""Where a switching step's device time goes (issue 5's diagnosis): a profiler trace of one
target-ready and one SPLASH step per direction, summarised per stream and kernel category.

On the lent nvidia-h200-x2 machine::

    python bench/switch_trace.py --out $OUT --directions TP-CP,CP-TP,CP-DOP \\
        --variants base,priority,ctas=8,processors=112

Writes ``<out>/<platform>/switch_trace.json`` (one row per variant, direction and mode: step
time, waits on transfers, each rank's per-layer medians of its untraced steps, and
:func:`splash_bench.device_trace.timeline`'s summary of rank 0's trace) and,
with ``--trace-dir``, rank 0's raw Chrome traces of the first variant.
``--smoke`` runs the same code on tiny shapes (CPU, gloo: no device kernels to summarise).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_bench import device_trace  # noqa: E402
from splash_bench import step as step_bench  # noqa: E402
from splash_bench.options import add_transfer_option, transfer_overrides  # noqa: E402
from splash_core import results  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    p.add_argument("--T", type=int, default=2)
    p.add_argument("--backend", default="auto")
    p.add_argument("--kernels", choices=("backend", "reference"), default="backend")
    p.add_argument("--platform", default=None, help="results folder (default: <hardware profile>x<T>, cpu on CPU)")
    p.add_argument("--model", default="deepseek-v3")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=65536)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--directions", default="TP-CP,CP-TP,CP-DOP")
    p.add_argument("--variants", default="base",
                   help="comma list of base, priority, ncclpriority, ctas=N, ce, processors=N, chunks=N, noalign, "
                        "nodefer, pulls, or several joined by + (splash_bench.device_trace)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timed-runs", type=int, default=3, help="untraced runs of each step, for its real time")
    p.add_argument("--trace-dir", default=None, help="where rank 0 writes the first variant's raw traces")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU")
    p.add_argument("--seed", type=int, default=0)
    add_transfer_option(p)
    args = p.parse_args(argv)
    args.transfer = transfer_overrides(args.transfer, p)
    if args.smoke:
        args.backend, args.kernels, args.model, args.dtype = "reference", "reference", "tiny-mla", "fp32"
        args.batch, args.context, args.rows, args.page_size, args.layers = 4, 64, 3, 16, 2
        args.platform = args.platform or "cpu"
    return args


def spec_of(args) -> dict:
    directions = [tuple(d.split("-")) for d in args.directions.split(",") if d]
    return {"model": args.model, "dtype": args.dtype, "batch": args.batch, "context": args.context, "rows": args.rows,
            "page_size": args.page_size, "layers": args.layers, "kernels": args.kernels, "seed": args.seed,
            "initial": directions[0][0], "directions": directions, "variants": args.variants.split(","),
            "warmup": args.warmup, "timed_runs": args.timed_runs, "trace_dir": args.trace_dir,
            "transfer": args.transfer}


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.time()
    with RankPool(args.T, backend=args.backend) as pool:
        info = pool.run(step_bench.describe_rank)
        platform = args.platform or ("cpu" if info[0]["device"] == "cpu" else f"{info[0]['profile'] or 'gpu'}x{args.T}")
        per_rank = pool.run(device_trace.trace_switches, spec_of(args))
    rows = per_rank[0]
    for row, *peers in zip(rows, *per_rank[1:]):  # the step time and waits of the slowest rank
        if "error" in row:
            continue
        row["step_ms"] = max([row["step_ms"]] + [p["step_ms"] for p in peers])
        row["exposed_ms"] = max([row["exposed_ms"]] + [p["exposed_ms"] for p in peers])
        row["untraced_ms"] = [max(times) for times in zip(row["untraced_ms"], *(p["untraced_ms"] for p in peers))]
        row["layers"] = [row["layers"]] + [p["layers"] for p in peers]  # per rank
        if "max_abs_diff_vs_ready" in row:
            row["max_abs_diff_vs_ready"] = max([row["max_abs_diff_vs_ready"]] + [p["max_abs_diff_vs_ready"] for p in peers])
    data = results.make_result(
        benchmark="switch_trace", samples=rows,
        summary={"workload": f"B={args.batch}, {args.context // 1024}K context, {args.layers} layers, prefill chunk "
                             f"of {args.rows} rows per request", "variants": args.variants.split(",")},
        notes="timeline: rank 0's profiler trace of the step (microseconds); step_ms and exposed_ms: slowest rank. "
              "Profiling adds host time per launch, so compare rows with each other, not with switch_overhead.json. "
              "max_abs_diff_vs_ready: the SPLASH step's logits against the ready step's (largest over ranks).",
        platform=platform, backend=info[0]["backend"], model=args.model, T=args.T, dtype=args.dtype)
    print("wrote", results.write_result(data, args.out), f"({time.time() - start:.0f} s)")
    print(f"{'variant':16s} {'direction':9s} {'mode':9s} {'untraced':>8s} {'step':>8s} {'waits':>7s} {'span':>8s} {'busy':>8s} "
          f"{'hostidle':>8s} {'waitidle':>8s} {'attn+':>7s} {'mm+':>7s} {'vs ready':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:16s} not run: {r['error']}")
            continue
        t = r["timeline"]
        extra = {c: t.get("slowdown", {}).get(c, {}).get("extra_us", 0.0) / 1e3 for c in ("attention", "matmul")}
        untraced = float(np.median(r["untraced_ms"])) if r["untraced_ms"] else float("nan")
        print(f"{r['variant']:16s} {r['src'] + '-' + r['dst']:9s} {r['mode']:9s} {untraced:8.2f} {r['step_ms']:8.2f} "
              f"{r['exposed_ms']:7.2f} {t.get('compute_span_us', 0) / 1e3:8.2f} {t.get('compute_busy_us', 0) / 1e3:8.2f} "
              f"{t.get('host_idle_us', 0) / 1e3:8.2f} {t.get('wait_idle_us', 0) / 1e3:8.2f} "
              f"{extra['attention']:7.2f} {extra['matmul']:7.2f} {r.get('max_abs_diff_vs_ready', 0.0):8.2g}")
    print_layers(rows)
    return 0


def print_layers(rows: list[dict]) -> None:
    """The probed untraced steps: per rank, totals of the per-layer medians (ms)."""
    print(f"\n{'variant':16s} {'direction':9s} {'mode':9s} rank {'span':>8s} {'compute':>8s} {'waits':>7s} "
          f"{'host':>8s} drained")
    for r in rows:
        for rank, layers in enumerate(r.get("layers") or []):
            t = layers.get("totals")
            if t:
                print(f"{r['variant']:16s} {r['src'] + '-' + r['dst']:9s} {r['mode']:9s} {rank:4d} {t['span_ms']:8.2f} "
                      f"{t['compute_ms']:8.2f} {t['wait_ms']:7.2f} {t['host_ms']:8.2f} {t['drained_layers']:3d}")


if __name__ == "__main__":
    sys.exit(main())
