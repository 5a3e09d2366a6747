#!/usr/bin/env python
"""Host time of a live switch: where the switching step's host work goes.

Runs the switch benchmark's workload (B requests x ``--context`` tokens, one chunked-prefill
step, every layer switching) on 2 ranks (gloo and the reference backend by default; an
accelerator backend with ``--backend``), with DeepSeek-like
page counts (B = 16 x 32K tokens at page 64: 8192 pages per layer) but tiny widths, so moving
data costs little and the executor's host bookkeeping stands out::

    python bench/switch_host_profile.py                 # all 12 directions, 1-2 minutes
    python bench/switch_host_profile.py --directions CP-TP,TP-CP --runs 3
    python bench/switch_host_profile.py --backend hopper --kernels backend --platform h200x2   # on 2 GPUs

Per direction: matched target-ready and SPLASH steps (p50 over ``--runs``), the SPLASH step's
switch work split into buckets of CPU time (see :mod:`splash_core.runtime.switch.host_profile`),
also per layer, and the same for the switch made outside a step ("warm"). Prints the table and
rank 0's cProfile of the executor's calls in one SPLASH step of ``--profile-direction``; writes
``<out>/cpu/switch_host_profile.json`` (``--baseline FILE``: an earlier run's summary is kept
beside it, for before/after).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_bench import switch_host_profile as host_profile  # noqa: E402
from splash_bench.options import add_transfer_option, transfer_overrides  # noqa: E402
from splash_core import results  # noqa: E402
from splash_core.layouts import Layout  # noqa: E402
from splash_core.results.stats import percentile  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402

T = 2
BUCKETS = (*host_profile.BUCKETS, "bookkeeping_ms")
TIMED = ("ready_ms", "splash_ms", "plan_ms", *BUCKETS, *(f"warm_{b}" for b in BUCKETS))


def tiny_model(layers: int, indexer: bool) -> dict:
    """A model profile (as a mapping) with MLA's structure and tiny widths: 8 B of KV per token."""
    return {"name": f"host-profile-{layers}l", "source": "made up for host profiling: tiny widths",
            "hidden_size": 32, "vocab_size": 64, "intermediate_size": 32,
            "layers": {"count": layers, "pattern": ["mla"]},
            "mla": {"heads": 2, "q_lora_rank": 8, "kv_lora_rank": 2, "qk_nope_head_dim": 4,
                    "qk_rope_head_dim": 2, "v_head_dim": 4},
            **({"indexer": {"heads": 1, "head_dim": 2, "topk": 8, "dtype": "bf16"}} if indexer else {}),
            "kv_cache": {"latent_dtype": "bf16", "rope_dtype": "bf16"}, "weight_dtype": "bf16",
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    p.add_argument("--platform", default="cpu", help="results folder (e.g. h200x2 with --backend hopper)")
    p.add_argument("--backend", default="reference", help="backend plugin of the ranks (one device each)")
    p.add_argument("--kernels", choices=("backend", "reference"), default="reference",
                   help="the backend's pack/unpack and attention kernels, or the torch reference ones")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=32768, help="tokens per request (a multiple of the page size)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--rows", type=int, default=8, help="query rows per request in the step")
    p.add_argument("--runs", type=int, default=5, help="timed runs per direction (after one that plans)")
    p.add_argument("--directions", default="", help="e.g. CP-TP,TP-CP (default: all 12)")
    p.add_argument("--profile-direction", default="CP-TP", help="the direction cProfile'd on rank 0")
    p.add_argument("--indexer", action="store_true", help="store indexer keys too (DeepSeek-V3.2-like)")
    p.add_argument("--baseline", default=None, help="an earlier switch_host_profile.json to keep beside")
    p.add_argument("--baseline-label", default=None,
                   help="what the baseline ran (default: its git commit), e.g. 'git 858c895, before the change'")
    p.add_argument("--no-write", action="store_true", help="print only")
    add_transfer_option(p)
    args = p.parse_args(argv)
    args.transfer = transfer_overrides(args.transfer, p)
    pairs = []
    for d in filter(None, args.directions.split(",")):
        pairs.append(_pair(p, d))
    args.pairs = pairs
    args.profile_pair = _pair(p, args.profile_direction)
    if args.context % args.page_size or not 0 < args.rows < args.page_size:
        p.error(f"--context must be a multiple of --page-size and 0 < --rows < page size (got {args.context}, "
                f"{args.page_size}, {args.rows})")
    return args


def _pair(p, text: str) -> tuple[str, str]:
    try:
        a, b = (str(Layout.parse(x)) for x in text.split("-"))
    except ValueError:
        p.error(f"a direction is SRC-DST with layouts TP, CP, DP, DOP (got {text!r})")
    if a == b:
        p.error(f"a direction needs two different layouts (got {text!r})")
    return a, b


def summarise(samples: list[dict], layers: int) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in samples:
        groups.setdefault((s["src"], s["dst"]), []).append(s)
    rows = []
    for (src, dst), runs in groups.items():
        over = [r["splash_ms"] - r["ready_ms"] for r in runs]
        p50 = {f: percentile([r[f] for r in runs], 50) for f in TIMED}
        rows.append({"src": src, "dst": dst, "ready_p50_ms": p50["ready_ms"], "splash_p50_ms": p50["splash_ms"],
                     "overhead_p50_ms": percentile(over, 50),
                     "switch_host_p50_ms": p50["prepare_ms"] + p50["start_ms"] + p50["land_ms"],
                     "prepare_p50_ms": p50["prepare_ms"],
                     "bookkeeping_per_layer_us": 1e3 * p50["bookkeeping_ms"] / layers,
                     "warm_bookkeeping_per_layer_us": 1e3 * p50["warm_bookkeeping_ms"] / layers,
                     "data_p50_ms": sum(p50[k] for k in ("issue_ms", "wait_ms", "pack_ms", "unpack_ms", "pull_ms")),
                     "runs": len(runs)})
    return rows


def _print(rows: list[dict]) -> None:
    print("wall ms: ready and SPLASH steps, their difference; CPU ms of the switch's host work in the step: all, "
          "prepare; CPU us of its bookkeeping per layer, in the step and (warm) outside a step; CPU ms moving data")
    print(f"{'direction':10s} {'ready':>8s} {'splash':>8s} {'overhead':>9s} {'switch':>7s} {'prepare':>7s} "
          f"{'bookkeep/layer':>14s} {'warm/layer':>10s} {'data':>7s}")
    for r in rows:
        print(f"{r['src'] + '->' + r['dst']:10s} {r['ready_p50_ms']:8.2f} {r['splash_p50_ms']:8.2f} "
              f"{r['overhead_p50_ms']:9.2f} {r['switch_host_p50_ms']:7.2f} {r['prepare_p50_ms']:7.2f} "
              f"{r['bookkeeping_per_layer_us']:14.0f} {r['warm_bookkeeping_per_layer_us']:10.0f} {r['data_p50_ms']:7.2f}")


def run(args, pool) -> int:
    """Profile on ``pool`` (2 ranks of ``--backend``), print, and write the result unless ``--no-write``."""
    start = time.time()
    spec = dict(model=tiny_model(args.layers, args.indexer), dtype="bf16", kernels=args.kernels, batch=args.batch,
                page_size=args.page_size, rows=args.rows, seed=0, initial="TP", layers=args.layers,
                context=args.context, runs=args.runs, directions=args.pairs, profile_direction=args.profile_pair,
                transfer=args.transfer)
    per_rank = pool.run(host_profile.host_profile, spec)
    samples = [{**s, **{f: max(r["samples"][i][f] for r in per_rank) for f in TIMED}}  # the slowest rank's
               for i, s in enumerate(per_rank[0]["samples"])]
    rows = summarise(samples, args.layers)
    pages = per_rank[0]["pages_per_layer"]
    workload = (f"B={args.batch}, {args.context // 1024}K context, page {args.page_size} ({pages} pages per layer), "
                f"{args.layers} layers, tiny widths, prefill chunk of {args.rows} rows per request")
    print(per_rank[0]["profile"])
    print(workload, f"({time.time() - start:.0f} s)")
    _print(rows)
    if args.no_write:
        return 0
    pulls = per_rank[0]["kv_pulls"]
    extra = {"pages_per_layer": pages, "profile": per_rank[0]["profile"], "kv_pulls": pulls, "transfer": args.transfer}
    if args.baseline:
        base = results.read_result(args.baseline)
        extra["baseline"] = {"label": args.baseline_label or base["git_commit"], "date": base["date"],
                             "command": base["command"], "summary": base["summary"]}
    data = results.make_result(
        benchmark="switch_host_profile", platform=args.platform, backend=args.backend, model=spec["model"]["name"], T=T,
        dtype="bf16", samples=samples, summary={"workload": workload, "layers": args.layers, "directions": rows},
        extra=extra,
        notes=(f"host time of the switching step ({args.backend} backend, {args.kernels} kernels, 2 ranks, slowest rank "
               "per sample): overhead = SPLASH step - target-ready step (wall clock; noisy on a shared CPU); "
               "switch_host = CPU time of the "
               "executor's prepare + per-layer start/land calls; bookkeeping = switch_host less issuing and "
               "waiting for collectives and page pack/unpack (data movement); KV pages "
               + ("pulled out of shared pools where their runs allow (--transfer peer_pulls=true), fenced by the peer "
                  "memory's barrier" if pulls else "moved by collectives")))
    print("wrote", results.write_result(data, args.out))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    with RankPool(T, backend=args.backend, timeout_s=600.0) as pool:
        return run(args, pool)


if __name__ == "__main__":
    sys.exit(main())
