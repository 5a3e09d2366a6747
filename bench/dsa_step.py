#!/usr/bin/env python
"""DeepSeek Sparse Attention on one device: a decode step and a prefill chunk, dense against
sparse, Triton against FlashMLA (issue 37 §3).

On one H200 (the lent machine; the hopper backend, FlashMLA from the ``sgl-flash-mla`` wheel)::

    python bench/dsa_step.py --out $OUT

For DeepSeek-V3.2's attention at its real widths (128 heads, 576-wide latent keys, its lightning
indexer of 64 heads x 128, top-2048; seeded weights, its dense MLP, ``--layers`` layers, TP at
T = 1), B requests at each context (32K and 128K by default), a bf16 and a scaled-fp8 (656-byte)
cache, synthetic histories (indexer keys too):

- ``decode``: one row per request at its last position; ``prefill``: ``--chunk-rows`` new rows
  per request ending at the context (B x chunk rows in one step); host wall time to the device done;
- ``dense``: every visible key; ``triton``/``flashmla``: the indexer's top-k only, attention by the
  backend's Triton kernel or FlashMLA's sparse kernels (their logits compared to Triton's);
- ``roofline``: the bytes (weights once, the attended cache entries, every indexer key) at the copy
  bandwidth and the FLOPs (projections, indexer scores, attention) at the matmul rate, both
  measured in the same run.

Writes ``<out>/<platform>/dsa_step.json`` through :mod:`splash_core.results`; ``--write-providers
FILE`` records, per cache format, FlashMLA as the hopper backend's sparse provider where it was
faster at every measured point with the same greedy tokens (else Triton). ``--smoke`` runs the same
code on the CPU reference with a tiny model.
"""

from __future__ import annotations

import argparse
import platform as host
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_bench import dsa_step as rank_side  # noqa: E402
from splash_bench import provider_table  # noqa: E402
from splash_bench import step as step_bench  # noqa: E402
from splash_core import results  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    step_bench.add_one_device_options(p)
    p.add_argument("--model", default="deepseek-v3.2")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--ffn-weights", choices=("compute", "fp8"), default="compute",
                   help="feed-forward weights in the compute format or kept FP8 (block-scaled e4m3)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--contexts", default="32768,131072", help="comma-separated history lengths")
    p.add_argument("--chunk-rows", type=int, default=256, help="new rows per request in the prefill chunk")
    p.add_argument("--caches", default="bf16,fp8", help="cache formats: bf16 and/or fp8 (scaled, 656 bytes)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--prefill-reps", type=int, default=2)
    p.add_argument("--copy-mib", type=int, default=2048, help="bytes copied to measure the copy bandwidth")
    p.add_argument("--matmul-n", type=int, default=8192, help="square matmul size for the matmul rate")
    p.add_argument("--budget-s", type=float, default=300.0, help="skip points that would start after this")
    p.add_argument("--prefill-form", default="absorbed", choices=("absorbed", "auto", "expanded"),
                   help="how dense prefill rows attend (sparse attention always attends absorbed)")
    p.add_argument("--providers", default="", help="sparse providers to time (comma-separated; default: all found)")
    p.add_argument("--write-providers", metavar="FILE", help="record the faster sparse provider per cache format")
    p.add_argument("--graphs", choices=("on", "off"), default="on", help="decode steps from captured graphs "
                   "where the backend captures (as served), or eagerly")
    p.add_argument("--profile", action="store_true", help="profile one more call of each point: device time by "
                   "kernel class and the longest-running kernels")
    p.add_argument("--name", default="dsa_step", help="file name (stem) of the result")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU reference: checks this script's logic")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.smoke:
        args.backend, args.model, args.contexts, args.chunk_rows = "reference", "tiny-mla", "64,160", 16
        args.page_size, args.reps, args.prefill_reps, args.platform = 16, 1, 1, args.platform or "cpu"
        args.copy_mib, args.matmul_n, args.batch, args.dtype, args.caches = 8, 128, 2, "fp32", "bf16"
    args.contexts = sorted(int(c) for c in str(args.contexts).split(","))
    args.caches = [c for c in str(args.caches).split(",") if c]
    unknown = set(args.caches) - set(rank_side.CACHE_FORMATS)
    if unknown:
        p.error(f"--caches: unknown format(s) {', '.join(sorted(unknown))} (bf16, fp8)")
    if min(args.contexts) < args.chunk_rows:
        p.error(f"--contexts must be at least --chunk-rows ({args.chunk_rows})")
    return args


def summarize(samples: list[dict]) -> list[dict]:
    """One row per point: median wall time, its ratio to the roofline, and agreement with Triton."""
    rows = []
    for s in samples:
        if "error" in s:
            rows.append({k: s[k] for k in ("cache", "context", "provider", "error")})
            continue
        ms = statistics.median(s["wall_ms"])
        rows.append({k: s[k] for k in ("cache", "phase", "context", "rows", "provider", "finite")}
                    | {"ms": ms, "roofline_ms": s["roofline_ms"], "over_roofline": ms / s["roofline_ms"],
                       **{k: s[k] for k in ("max_logit_diff_vs_triton", "tokens_match_triton", "replayed") if k in s}})
    return rows


def sparse_choice(points: list[dict]) -> dict:
    """Per cache format and phase (decode and prefill are different kernels of FlashMLA's): FlashMLA
    where it was faster than Triton at every measured point of the phase with the same greedy tokens,
    else Triton (``phases``); ``provider``: FlashMLA only where it won every phase."""
    out = {}
    for cache in sorted({p["cache"] for p in points}):
        mine, theirs = ({(p["phase"], p["context"]): p for p in points
                         if p["cache"] == cache and p.get("provider") == who} for who in ("triton", "flashmla"))
        wins = {k for k, p in theirs.items() if k in mine and p.get("tokens_match_triton") and p["ms"] < mine[k]["ms"]}
        phases = {ph: "flashmla" if all(k in wins for k in mine if k[0] == ph) else "triton"
                  for ph in sorted({ph for ph, _ in mine})}
        out[cache] = {"provider": "flashmla" if phases and set(phases.values()) == {"flashmla"} else "triton",
                      "points": len(mine), "flashmla_faster": len(wins), "phases": phases}
    return out


def write_providers(path: str, choice: dict, command: str, machine: str) -> None:
    """Set the ``sparse`` entry of the hopper backend's provider table (other entries kept)."""
    provider_table.set_entries(path, {"sparse": {**choice, **provider_table.provenance(command, machine)}})


def _profile_line(s: dict) -> str:
    """A profiled point: its classes' shares and its three longest-running kernels."""
    p, where = s["profile"], f"{s['cache']} {s['phase']} ctx={s['context']} {s['provider']}"
    if "error" in p:
        return f"   profile {where}: none ({p['error']})"
    shares = ", ".join(f"{name} {c['share']:.0%}" + (f" (x{c['over_floor']:.2f} floor)" if c.get("over_floor") else "")
                       for name, c in p["classes"].items() if c["share"] >= 0.01)
    top = "; ".join(f"{k['name'][:48]} {k['us'] / 1e3:.1f} ms x{k['calls']}" for k in p["top"][:3])
    series = f", x{p['over_serial_floor']:.2f} the floors in series" if p.get("over_serial_floor") else ""
    return f"   profile {where}: {p['span_us'] / 1e3:.1f} ms span, idle {p['idle_share']:.0%}{series}: {shares} | {top}"


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['cache']:>4s} ctx={r['context']:>7d} {r['provider']:>8s}: {r['error']}"
    agree = (f"  vs triton: diff {r['max_logit_diff_vs_triton']:.3g}, tokens "
             f"{'match' if r['tokens_match_triton'] else 'differ'}") if "tokens_match_triton" in r else ""
    graph = " (graph)" if r.get("replayed") else ""
    return (f"{r['cache']:>4s} {r['phase']:>7s}{graph} ctx={r['context']:>7d} rows={r['rows']:<5d} {r['provider']:>8s} "
            f"{r['ms']:9.2f} ms  roofline {r['roofline_ms']:8.2f} ms  x{r['over_roofline']:.2f}{agree}")


def run(args, pool) -> int:
    start = time.time()
    info, platform = step_bench.one_device_platform(args, pool)
    spec = dict(model=args.model, dtype=args.dtype, layers=args.layers, batch=args.batch, contexts=args.contexts,
                chunk_rows=args.chunk_rows, caches=args.caches, prefill_form=args.prefill_form,
                providers=[p for p in args.providers.split(",") if p], page_size=args.page_size, kernels=args.kernels,
                seed=args.seed, reps=args.reps, prefill_reps=args.prefill_reps, copy_mib=args.copy_mib,
                matmul_n=args.matmul_n, deadline=start + args.budget_s, profile=args.profile,
                graphs=args.graphs == "on", ffn_weights=args.ffn_weights)
    got = pool.run(rank_side.measure, spec)[0]
    points = summarize(got["samples"])
    for row in points:
        print(_line(row), flush=True)
    for s in got["samples"]:
        if "profile" in s:
            print(_profile_line(s), flush=True)
    choice = sparse_choice([p for p in points if "error" not in p])
    summary = {"rates": got["rates"], "ffn_weights": args.ffn_weights, "points": points, "skipped": got["skipped"],
               "sparse_providers": choice}
    data = results.make_result(
        benchmark="dsa_step", platform=platform, backend=info["backend"], model=args.model, T=1, dtype=args.dtype,
        samples=got["samples"], summary=summary,
        notes=(f"{args.layers} layers, TP, B = {args.batch}, prefill chunk {args.chunk_rows} rows per request; "
               f"seeded weights (dense MLP, feed-forward {args.ffn_weights}), synthetic histories; wall = host time "
               f"to the device done (decode "
               f"{'replayed from captured graphs where the backend captures' if args.graphs == 'on' else 'eager'}); "
               f"roofline = max(bytes / copy bandwidth, FLOPs / matmul rate, those through FP8-kept weights at the "
               f"FP8 rate where measured), the rates measured in this run (copy bandwidth counts bytes read + "
               f"written); a profile's classes carry their own floors (class_costs)"))
    print("wrote", results.write_result(data, args.out, name=args.name), f"({time.time() - start:.0f} s)", flush=True)
    if args.write_providers:
        write_providers(args.write_providers, choice, " ".join(sys.argv), f"{host.node()} {info['device']}")
        print("sparse providers:", choice, "->", args.write_providers, flush=True)
    bad = [p for p in points if "error" not in p and not p["finite"]]
    return 1 if bad else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    with RankPool(1, backend=args.backend, timeout_s=900) as pool:
        return run(args, pool)


if __name__ == "__main__":
    sys.exit(main())
