#!/usr/bin/env python
"""One MoE layer's two ways to its experts on T ranks (issue 38): today's all-reduce path (the owners'
rows gathered to every rank, the layer on every row, one all-reduce) against the all-to-all path
(each owner's rows dispatched to their experts' ranks and combined back, then the output gathered:
``moe_dispatch`` in a deployment), at real widths with seeded weights, per step row count.

On a host with two or more GPUs (the backend's collectives, NCCL on NVIDIA)::

    python bench/moe_dispatch.py --T 2 --out $OUT         # --T 8 on eight

Per row count N (each rank owning N/T): each path's device time (the slowest rank's median), both
paths' outputs compared (they sum the same pairs in another order), and each path's floor in the
same run: the bytes it moves per rank at the link rates measured here (all-gather, all-to-all and
all-reduce fitted as ``splash calibrate`` does) plus the experts' floor (their FLOPs at the measured
matmul rate or their weights at the measured copy rate, whichever is longer) and its collectives'
measured latency, with the ratio of each
time to its floor; beside them, where the hardware profile's rule (``moe_dispatch: cheaper``) starts
the all-to-all. Writes ``<out>/<platform>/moe_dispatch.json``; ``--smoke`` runs tiny shapes on CPU
ranks (gloo) in seconds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_bench import moe_dispatch  # noqa: E402
from splash_bench.moe_dispatch import model_profile  # noqa: E402
from splash_bench.step import describe_rank  # noqa: E402
from splash_core import dtypes, results  # noqa: E402
from splash_core.checkpoint.tiny import ensure  # noqa: E402
from splash_core.layouts import Layout  # noqa: E402
from splash_core.planning.moe_dispatch import dispatch_rule  # noqa: E402
from splash_core.profiles.loader import load  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results", help="results root; files go to <out>/<platform>/")
    p.add_argument("--T", type=int, default=2, help="ranks (one per device)")
    p.add_argument("--backend", default="auto", help="backend plugin (auto: the accelerator's, else reference)")
    p.add_argument("--platform", default=None, help="results folder (default: the backend's hardware profile)")
    p.add_argument("--model", default="deepseek-v3", help="model profile (its first MoE layer's widths)")
    p.add_argument("--hardware", default="h200", help="hardware profile whose rule is shown beside the times")
    p.add_argument("--dtype", default=None, help="compute format (default bf16; fp32 with --smoke)")
    p.add_argument("--rows", default="256,2048,8192,32768", help="comma-separated rows per step (all ranks)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--copy-mib", type=int, default=2048)
    p.add_argument("--matmul-n", type=int, default=8192)
    p.add_argument("--tolerance", type=float, default=None,
                   help="paths' outputs: max |diff| / max |value| (default 1e-4 in fp32, else 0.02: the two bf16 "
                        "paths differ by 0.005-0.007 on CPU ranks)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn weights")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU ranks: checks this script's logic")
    args = p.parse_args(argv)
    if args.smoke:
        args.backend, args.model, args.rows = "reference", str(ensure("tiny-deepseek-v3")), "8,32"
        args.reps, args.copy_mib, args.matmul_n, args.platform = 2, 8, 128, args.platform or "cpu"
        args.dtype = args.dtype or "fp32"
    args.dtype = args.dtype or "bf16"
    if args.tolerance is None:
        args.tolerance = 1e-4 if args.dtype == "fp32" else 0.02
    args.rows = sorted(int(n) for n in str(args.rows).split(","))
    return args


def summarize(args, per_rank: list[dict]) -> list[dict]:
    """Per row count: the slowest rank's times and floors, their ratios, and the profile rule's choice
    (after a DP layer)."""
    profile, T, act_bytes = model_profile(args), len(per_rank), dtypes.nbytes(args.dtype)
    rule = dispatch_rule("cheaper", profile, load("hardware", args.hardware), T, act_bytes)
    rates = per_rank[0]["rates"]
    out = []
    for i in range(len(args.rows)):
        mine = [r["points"][i] for r in per_rank]
        ms = {path: max(p["ms"][path] for p in mine) for path in ("all_reduce", "all_to_all")}
        floor = [moe_dispatch.floors(profile, T, act_bytes, rates, p["rows"], p["sent_rows"], p["pairs_here"])
                 for p in mine]
        worst = {path: max(f[path] for f in floor) for path in ms}
        out.append({"rows": mine[0]["rows"], **{f"{p}_ms": ms[p] for p in ms},
                    **{f"{p}_floor_ms": worst[p] for p in ms}, **{f"{p}_over_floor": ms[p] / worst[p] for p in ms},
                    "faster": min(ms, key=ms.get), "rule_dispatches": rule.by_all_to_all(Layout.DP, mine[0]["rows"]),
                    "mismatch": [p["mismatch"] for p in mine if p["mismatch"]]})
    return out


def run(args, pool) -> int:
    info = pool.run(describe_rank)[0]
    per_rank = pool.run(moe_dispatch.measure, args)
    rows = summarize(args, per_rank)
    for r in rows:
        print(f"N={r['rows']:<6d} all-reduce {r['all_reduce_ms']:8.3f} ms ({r['all_reduce_over_floor']:.2f}x floor)  "
              f"all-to-all {r['all_to_all_ms']:8.3f} ms ({r['all_to_all_over_floor']:.2f}x)  faster: {r['faster']}, "
              f"{args.hardware} rule: {'all-to-all' if r['rule_dispatches'] else 'all-reduce'}"
              + (f"  MISMATCH {r['mismatch']}" if r["mismatch"] else ""))
    platform = args.platform or info["profile"] or "cpu"
    samples = [{"rank": rank, **p} for rank, r in enumerate(per_rank) for p in r["points"]]
    data = results.make_result(benchmark="moe_dispatch", platform=platform, backend=info["backend"],
                               model=model_profile(args).name, T=len(per_rank), dtype=args.dtype, samples=samples,
                               summary={"points": rows, "rates": per_rank[0]["rates"], "hardware_rule": args.hardware})
    print(f"wrote {results.write_result(data, args.out)}")
    return 1 if any(r["mismatch"] for r in rows) else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    with RankPool(args.T, backend=args.backend, timeout_s=600) as pool:
        return run(args, pool)


if __name__ == "__main__":
    sys.exit(main())
