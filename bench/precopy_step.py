#!/usr/bin/env python
"""Host profile of a pre-copy step against an ordinary step (issue 26), on 2 ranks.

Runs B requests x ``--context`` tokens in decode (``--rows`` query rows each), with DeepSeek-like
page counts (B = 16 x 32K tokens at page 64: 8192 pages per layer) but tiny widths, so the
pre-copy's host bookkeeping stands out (gloo and the reference backend by default: every part
of a step is host work on CPU). Per direction: the ordinary step, each step of a pre-copy of
``--precopy-steps`` steps (its own host work apart), the handoff and the one-step switch (p50
over ``--runs``, the slowest rank per sample)::

    python bench/precopy_step.py                       # 4 directions where KV moves, ~1 minute
    python bench/precopy_step.py --directions DP-TP --runs 3 --no-write

Writes ``<out>/cpu/precopy_step.json`` (command, machine, date, raw samples). On CPU the
background copies share the 2 ranks' cores with the step, so the pre-copy step's extra time is
an upper bound of what a device with copy engines would see, not a measurement of one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from switch_host_profile import tiny_model  # noqa: E402

from splash_bench import precopy_step as rank_side  # noqa: E402
from splash_core import results  # noqa: E402
from splash_core.layouts import Layout  # noqa: E402
from splash_core.results.stats import percentile  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402

T = 2
KINDS = ("ordinary", "precopy", "handoff", "one_step")
DEFAULT_DIRECTIONS = "DP-TP,CP-TP,CP-DP,DP-CP"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    p.add_argument("--platform", default="cpu", help="results folder")
    p.add_argument("--backend", default="reference", help="backend plugin of the ranks")
    p.add_argument("--kernels", choices=("backend", "reference"), default="reference")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=32768, help="tokens per request (a multiple of the page size)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--rows", type=int, default=1, help="query rows per request in the step (1: decode)")
    p.add_argument("--precopy-steps", type=int, default=4, help="steps each pre-copy spans before its handoff")
    p.add_argument("--runs", type=int, default=5, help="timed runs per direction (after one that plans)")
    p.add_argument("--directions", default=DEFAULT_DIRECTIONS, help=f"SRC-DST,... (default {DEFAULT_DIRECTIONS})")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    args.pairs = [_pair(p, d) for d in args.directions.split(",") if d]
    if args.context % args.page_size or not 0 < args.rows < args.page_size:
        p.error(f"--context must be a multiple of --page-size and 0 < --rows < page size (got {args.context}, "
                f"{args.page_size}, {args.rows})")
    if args.precopy_steps < 1 or args.runs < 1 or not args.pairs:
        p.error("--precopy-steps and --runs must be >= 1, and --directions must name one direction")
    return args


def _pair(p, text: str) -> tuple[str, str]:
    try:
        a, b = (str(Layout.parse(x)) for x in text.split("-"))
    except ValueError:
        p.error(f"a direction is SRC-DST with layouts TP, CP, DP, DOP (got {text!r})")
    if a == b:
        p.error(f"a direction needs two different layouts (got {text!r})")
    return a, b


def summarise(samples: list[dict]) -> list[dict]:
    rows = []
    for src, dst in dict.fromkeys((s["src"], s["dst"]) for s in samples):
        mine = [s for s in samples if (s["src"], s["dst"]) == (src, dst)]
        p50 = {kind: percentile([s["wall_ms"] for s in mine if s["kind"] == kind], 50) for kind in KINDS}
        pre = [s for s in mine if s["kind"] == "precopy"]
        tail = [s["received_bytes"] for s in mine if s["kind"] == "handoff"]
        whole = [s["received_bytes"] for s in mine if s["kind"] == "one_step"]
        rows.append({"src": src, "dst": dst, **{f"{kind}_p50_ms": p50[kind] for kind in KINDS},
                     "precopy_extra_p50_ms": p50["precopy"] - p50["ordinary"],
                     "precopy_host_p50_ms": percentile([s["host_ms"] for s in pre], 50),
                     "handoff_kv_bytes": max(tail), "one_step_kv_bytes": max(whole),
                     "paused_steps": sum(bool(s["paused"]) for s in pre), "runs": len(tail)})
    return rows


def _print(rows: list[dict]) -> None:
    print("wall ms (p50, slowest rank): ordinary step, pre-copy step (its extra, its own host work), handoff, "
          "one-step switch; KV bytes this rank received in the handoff and in the one-step switch")
    print(f"{'direction':10s} {'ordinary':>9s} {'precopy':>8s} {'extra':>7s} {'host':>6s} {'handoff':>8s} "
          f"{'one-step':>9s} {'tail KiB':>9s} {'whole KiB':>10s}")
    for r in rows:
        print(f"{r['src'] + '->' + r['dst']:10s} {r['ordinary_p50_ms']:9.2f} {r['precopy_p50_ms']:8.2f} "
              f"{r['precopy_extra_p50_ms']:7.2f} {r['precopy_host_p50_ms']:6.2f} {r['handoff_p50_ms']:8.2f} "
              f"{r['one_step_p50_ms']:9.2f} {r['handoff_kv_bytes'] / 1024:9.1f} {r['one_step_kv_bytes'] / 1024:10.1f}")


def run(args, pool) -> int:
    start = time.time()
    spec = dict(model=tiny_model(args.layers, False), dtype="bf16", kernels=args.kernels, batch=args.batch,
                page_size=args.page_size, rows=args.rows, seed=0, initial="TP", layers=args.layers,
                context=args.context, runs=args.runs, directions=args.pairs, precopy_steps=args.precopy_steps)
    per_rank = pool.run(rank_side.precopy_steps, spec)
    timed = ("wall_ms", "cpu_ms", "host_ms")
    samples = [{**s, **{f: max(r["samples"][i][f] for r in per_rank) for f in timed if f in s}}
               for i, s in enumerate(per_rank[0]["samples"])]
    rows = summarise(samples)
    pages = per_rank[0]["pages_per_layer"]
    workload = (f"B={args.batch}, {args.context // 1024}K context, page {args.page_size} ({pages} pages per layer), "
                f"{args.layers} layers, tiny widths, {args.rows} query row(s) per request, pre-copies of "
                f"{args.precopy_steps} steps")
    print(workload, f"({time.time() - start:.0f} s)")
    _print(rows)
    if args.no_write:
        return 0
    data = results.make_result(
        benchmark="precopy_step", platform=args.platform, backend=args.backend, model=spec["model"]["name"], T=T,
        dtype="bf16", samples=samples, summary={"workload": workload, "layers": args.layers, "directions": rows},
        extra={"pages_per_layer": pages},
        notes=(f"{args.backend} backend, {args.kernels} kernels, 2 ranks, slowest rank per sample, wall clock "
               "(noisy on a shared CPU). precopy_extra = pre-copy step - ordinary step; precopy_host = the pre-copy's own "
               "host work in its step; on CPU the copies share the ranks' cores with the step, so this says "
               "nothing yet of a device's interference coefficient (scheduler.precopy_interference)"))
    print("wrote", results.write_result(data, args.out))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    with RankPool(T, backend=args.backend, timeout_s=600.0) as pool:
        return run(args, pool)


if __name__ == "__main__":
    sys.exit(main())
