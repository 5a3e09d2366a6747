#!/usr/bin/env python
"""A decode step at T = 1, eager against replayed from its captured graph (issue 22 §5).

On one H200 (the lent ``nvidia-h200`` machine; the backend's CUDA graphs and fused kernels)::

    python bench/decode_step.py --out $OUT

For B = 1, 16, 64 balanced requests at contexts 8K, 32K, 128K (DeepSeek-V3 attention dims with
its dense MLP, seeded weights, synthetic histories; one layout, TP by default), on one model per
B with as many layers as fit at the longest context (``bench/runtime_step.py``'s sizing):

- ``eager``: the model's plain step (backend's fused kernels), host wall time to the device
  being done, and the device time of its kernels (the profiler's sum, where it runs);
- ``eager_unfused``: the same with the torch ops fused kernels replaced (the step before issue 22);
- ``graph``: the decode step from persistent buffers, replaying the graph of its bucket: wall
  time of the whole step (tables, inputs, replay, logits), and the device time of the replay
  alone (events around back-to-back replays); the capture's host time and graph memory; whether
  its greedy tokens equal the eager step's;
- ``roofline``: the weights read once plus every KV history, at the copy bandwidth measured in
  the same run, and the projections' and attention's FLOPs at the matmul rate measured in it;
- ``--profile`` (issue 39): a few replays under the profiler, the median one's kernels by class
  (attention, GEMMs, LM head, routing/top-k, elementwise, copies; idle gaps between kernels),
  each class beside its bytes and FLOPs (:mod:`splash_bench.replay_profile`). Only the issue's
  points: ``--profile --batches 16,32,64 --contexts 32768,131072``.

Writes ``<out>/<platform>/decode_step.json`` through :mod:`splash_core.results` and prints a
table; points past ``--budget-s`` are skipped (listed in the summary). Exit code 1 if a graph's
greedy token differs from the eager step's where that is no near tie (``decisive_mismatches``). ``--smoke`` runs the same
code on the CPU reference with tiny shapes (there the graph path runs its static-buffer step
eagerly: the reference cannot capture).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_bench import decode_step as rank_side  # noqa: E402
from splash_bench import step as step_bench  # noqa: E402
from splash_core import dtypes, results  # noqa: E402
from splash_core.layouts import Layout  # noqa: E402
from splash_core.profiles.loader import load  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    step_bench.add_one_device_options(p)
    p.add_argument("--model", default="deepseek-v3")
    p.add_argument("--layout", default="TP", choices=[str(l) for l in Layout])
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--ffn-weights", choices=("compute", "fp8"), default="compute",
                   help="the dense MLP's weights: in the compute format, or kept FP8 block-scaled (seeded)")
    p.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes")
    p.add_argument("--contexts", default="8192,32768,131072", help="comma-separated history lengths")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--min-table-pages", type=int, default=16, help="narrowest captured block table")
    step_bench.add_memory_options(p, margin_gib=4.0)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--copy-mib", type=int, default=2048, help="bytes copied to measure the copy bandwidth")
    p.add_argument("--matmul-n", type=int, default=8192, help="square matmul size for the matmul rate")
    p.add_argument("--no-unfused", dest="unfused", action="store_false", help="skip the eager_unfused variant")
    p.add_argument("--budget-s", type=float, default=300.0, help="skip points that would start after this")
    p.add_argument("--profile", action="store_true",
                   help="profile --profile-reps replays per point: device time per kernel class, idle gaps")
    p.add_argument("--profile-reps", type=int, default=3, help="profiled replays per point (the median is kept)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU reference: checks this script's logic")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.smoke:
        args.backend, args.model, args.batches, args.contexts = "reference", "tiny-mla", "1,4", "48,96"
        args.page_size, args.reps, args.warmup, args.platform = 16, 2, 1, args.platform or "cpu"
        args.copy_mib, args.matmul_n, args.margin_gib, args.min_table_pages = 8, 128, 0.0, 2
        args.dtype = "fp32"
    args.batches = sorted(int(b) for b in str(args.batches).split(","))
    args.contexts = sorted(int(c) for c in str(args.contexts).split(","))
    return args


def layer_counts(args, memory) -> tuple[dict, dict]:
    """Layers per batch size (as many as fit that B at the longest context), with the accounting."""
    profile = load("model", args.model)
    budget = memory[0] * args.memory_fraction if memory else args.cpu_budget_gib * (1 << 30)
    counts, accounting = {}, {}
    for batch in args.batches:
        fit, acc = step_bench.layers_that_fit(profile, 1, batch, max(args.contexts), args.page_size,
                                              dtypes.nbytes(args.dtype), budget, 1, args.margin_gib)
        counts[str(batch)] = min(fit, args.max_layers) if args.max_layers else fit
        accounting[str(batch)] = {**acc, "layers_fit": fit}
    return counts, accounting


def summarize(samples: list[dict]) -> list[dict]:
    """One row per (batch, context): medians of every path, and the ratios the issue's targets name."""
    rows = {}
    for s in samples:
        row = rows.setdefault((s["batch"], s["context"]), {"batch": s["batch"], "context": s["context"],
                                                            "layers": s["layers"]})
        if s["path"] == "roofline":
            row["roofline_ms"] = s["roofline_ms"]
            continue
        row[f"{s['path']}_ms"] = statistics.median(s["wall_ms"])
        if s.get("device_ms") is not None:
            row[f"{s['path']}_device_ms"] = s["device_ms"]
        if s["path"] == "graph":
            row.update(tokens_match=s["tokens_match"], decisive_mismatches=s["decisive_mismatches"],
                       captured=s["captured"])
            if "profile" in s:
                row["profile"] = s["profile"]
            if "failed" in s:  # the bucket's capture failed and its steps ran eagerly: no replay to time
                row["failed"] = s["failed"]
            else:  # captured, or (no graph ops: CPU) the static-buffer step run eagerly
                row.update(replay_ms=statistics.median(s["replay_ms"]), capture_s=s["capture_s"],
                           graph_bytes=s["graph_bytes"])
    for row in rows.values():
        row["eager_over_graph"] = row["eager_ms"] / row["graph_ms"] if row["graph_ms"] > 0 else 0.0
        if "replay_ms" in row:
            row["wall_over_replay"] = row["graph_ms"] / row["replay_ms"] if row["replay_ms"] > 0 else 0.0
            row["replay_over_roofline"] = row["replay_ms"] / row["roofline_ms"] if row["roofline_ms"] > 0 else 0.0
    return [rows[k] for k in sorted(rows)]


def _line(r: dict) -> str:
    unfused = f" unfused {r['eager_unfused_ms']:8.2f}" if "eager_unfused_ms" in r else ""
    if "replay_ms" not in r:
        return (f"B={r['batch']:<3d} ctx={r['context']:>7d} L={r['layers']:<3d} eager {r['eager_ms']:8.2f}{unfused} "
                f"graph (eager fallback) {r['graph_ms']:8.2f} ms: capture failed: {r.get('failed', '')}")
    return (f"B={r['batch']:<3d} ctx={r['context']:>7d} L={r['layers']:<3d} eager {r['eager_ms']:8.2f}{unfused} "
            f"graph {r['graph_ms']:8.2f} replay {r['replay_ms']:8.2f} roofline {r['roofline_ms']:8.2f} ms  "
            f"wall/replay {r['wall_over_replay']:.2f} eager/graph {r['eager_over_graph']:.1f}x  "
            f"capture {r['capture_s']:.2f} s {r['graph_bytes'] / (1 << 20):.0f} MiB tokens "
            f"{'match' if r['tokens_match'] else 'differ'} ({r['decisive_mismatches']} decisively)")


def _profile_line(p: dict) -> str:
    """One point's profiled replay: each class's share of the kernels' span, then the idle gap."""
    if "error" in p:
        return f"profile: none ({p['error']})"
    parts = [f"{name} {c['share']:.0%}" + (f" ({c['over_floor']:.2f}x floor)" if c.get("over_floor") else "")
             for name, c in p["classes"].items() if c["kernels"]]
    return (f"profile over {p['span_us'] / 1e3:.2f} ms of kernels: " + ", ".join(parts)
            + f"; idle {p['idle_share']:.0%}; outside the span {p['outside_span_us'] / 1e3:.2f} ms"
            + (f"; {p['over_serial_floor']:.2f}x the classes' floors in series" if p.get("over_serial_floor") else ""))


def run(args, pool) -> int:
    start = time.time()
    info, platform = step_bench.one_device_platform(args, pool)
    counts, accounting = layer_counts(args, info["memory"])
    print(f"backend {info['backend']} on {info['device']}; layers per batch {counts}", flush=True)
    spec = dict(model=args.model, layout=args.layout, dtype=args.dtype, batches=args.batches, contexts=args.contexts,
                page_size=args.page_size, min_table_pages=args.min_table_pages, layers=counts, kernels=args.kernels,
                seed=args.seed, reps=args.reps, warmup=args.warmup, copy_mib=args.copy_mib, matmul_n=args.matmul_n,
                unfused=args.unfused, deadline=start + args.budget_s, profile=args.profile,
                profile_reps=args.profile_reps, ffn_weights=args.ffn_weights)
    got = pool.run(rank_side.measure, spec)[0]
    points = summarize(got["samples"]) if got["samples"] else []
    for row in points:
        print(_line(row), flush=True)
        if "profile" in row:
            print("   " + _profile_line(row["profile"]), flush=True)
    summary = {"rates": got["rates"], "ffn_weights": args.ffn_weights, "layers": counts, "memory": accounting, "points": points,
               "skipped": got["skipped"]}
    data = results.make_result(
        benchmark="decode_step", platform=platform, backend=info["backend"], model=args.model, T=1, dtype=args.dtype,
        samples=got["samples"], summary=summary,
        notes=(f"layout {args.layout}; synthetic histories, seeded weights (dense MLP, {args.ffn_weights}); wall = host time to the "
               f"device done; replay = device time of the captured graph alone (events); device_ms = the profiler's "
               f"kernel sum of one eager step; roofline = (weights + KV bytes) / copy bandwidth vs FLOPs / matmul "
               f"rate, both measured in this run (copy bandwidth counts bytes read + written); profile "
               f"(--profile): the kernels of the median of a few profiled replays by class "
               f"(bench/splash_bench/kernel_classes.py; on the CPU its outermost operators), shares of their span, "
               f"idle = span less busy time, outside_span = event replay time less the span"))
    name = "decode_step" + ("-fp8" if args.ffn_weights == "fp8" else "")
    print("wrote", results.write_result(data, args.out, name), f"({time.time() - start:.0f} s)", flush=True)
    return 0 if not any(r["decisive_mismatches"] for r in points) else 1  # near ties may flip in bf16


def main(argv=None) -> int:
    args = parse_args(argv)
    with RankPool(1, backend=args.backend, timeout_s=900) as pool:
        return run(args, pool)


if __name__ == "__main__":
    sys.exit(main())
