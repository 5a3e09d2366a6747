"""How long planning one layout switch takes on this CPU (issue 2's target: < 50 ms for 61
layers, T = 8, 256 requests).

For each of the 12 directions it times, over several repeats:

- ``plan``: :func:`splash_core.planning.manifest.plan_switch` for every layer of the model, with
  per-rank bytes, primitives and the Eq 5 peak, from a batch of requests with random
  contexts (uniform in [1, max_context], seeded) and round-robin owners;
- ``plan + rank arrays``: the same plus the explicit key arrays one rank's executor needs
  (kept / freed / fetched / per-peer sends of every state), what a rank does at a switch.

Writes ``bench/results/cpu/plan_speed.json`` (schema: docs/results.md, ``plan_speed``).

    python bench/plan_speed.py [--repeats 7] [--model deepseek-v3.2] [--T 8] [--requests 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from splash_core.layouts import DIRECTIONS
from splash_core.planning.manifest import plan_switch
from splash_core.planning.ownership import Batch, Request
from splash_core.profiles import load
from splash_core.results import make_result, write_result

TARGET_MS = 50.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v3.2")
    ap.add_argument("--T", type=int, default=8)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-context", type=int, default=128 * 1024)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results", help="results root (default bench/results)")
    args = ap.parse_args()

    model = load("model", args.model)
    rng = np.random.default_rng(args.seed)
    contexts = rng.integers(1, args.max_context + 1, size=args.requests)
    batch = Batch(tuple(Request(i, int(s), i % args.T) for i, s in enumerate(contexts)))
    label = f"{args.requests} requests, {model.num_layers} layers"

    samples = []
    for src, dst in DIRECTIONS:
        plan_case, rank_case = f"plan {src}->{dst}, {label}", f"plan + rank arrays {src}->{dst}, {label}"
        for _ in range(args.repeats):
            start = time.perf_counter()
            manifest = plan_switch(src, dst, batch, model, args.T, args.page_size)
            manifest.peak  # the Eq 5 check is part of planning
            samples.append({"case": plan_case, "us": (time.perf_counter() - start) * 1e6})
            start = time.perf_counter()
            manifest = plan_switch(src, dst, batch, model, args.T, args.page_size)
            manifest.peak
            for layer in manifest.classes():
                for state_plan in layer.states.values():
                    state_plan.rank(0)
            samples.append({"case": rank_case, "us": (time.perf_counter() - start) * 1e6})

    cases = []
    for case in dict.fromkeys(s["case"] for s in samples):
        us = sorted(s["us"] for s in samples if s["case"] == case)
        cases.append({"case": case, "p50_us": statistics.median(us),
                      "p95_us": float(np.percentile(us, 95)), "runs": len(us)})
    worst_plan_p50_ms = max(c["p50_us"] for c in cases if not c["case"].startswith("plan + ")) / 1e3
    result = make_result(
        benchmark="plan_speed", platform="cpu", backend="none (pure planner)", model=model.name,
        T=args.T, dtype=model.weight_dtype, samples=samples, summary={"cases": cases},
        notes=(f"contexts uniform in [1, {args.max_context}] (seed {args.seed}), page {args.page_size}, "
               f"round-robin owners, {int(contexts.sum())} tokens in all; target < {TARGET_MS:g} ms per plan"),
        extra={"workload": {"requests": args.requests, "max_context": args.max_context,
                            "page_size": args.page_size, "seed": args.seed, "tokens": int(contexts.sum())},
               "target_ms": TARGET_MS, "worst_plan_p50_ms": worst_plan_p50_ms,
               "meets_target": worst_plan_p50_ms < TARGET_MS},
    )
    path = write_result(result, args.out)
    for c in cases:
        print(f"{c['case']:<60} p50 {c['p50_us'] / 1e3:7.2f} ms  p95 {c['p95_us'] / 1e3:7.2f} ms")
    print(f"worst direction p50 {worst_plan_p50_ms:.2f} ms (target < {TARGET_MS:g} ms) -> {path}")


if __name__ == "__main__":
    main()
