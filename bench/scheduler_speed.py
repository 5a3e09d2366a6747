"""How long one decision of the scheduler π(x; θ) takes on this CPU (issue 3's target: under
100 µs for 256 running requests).

Cases, each timed call by call over a decode batch of random contexts (seeded) with
round-robin owners on the chosen deployment:

- ``decide``: :meth:`Scheduler.decide` from ready arrays — Eq 10 for all four layouts,
  Eq 6 on every rank, the argmin and the margin (a stay decision, the common case);
- ``arrays + decide``: the same plus building :class:`BatchArrays` from Python lists, as an
  engine that keeps lists would;
- ``evaluate``: the cost model alone;
- ``decide, prefill``: a mixed step where a quarter of the requests prefill 512-row chunks.

Samples are wall-clock microseconds per call; the summary also gives process CPU time per
call (this VM is shared, so wall time includes waits for a core).

Writes ``bench/results/cpu/scheduler_speed.json`` (schema: docs/results.md, ``scheduler_speed``).

    python bench/scheduler_speed.py [--deployment h200-x8-deepseek-v3.2] [--requests 256] [--calls 2000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from splash_core.layouts import Layout
from splash_core.planning.costmodel import BatchArrays
from splash_core.planning.scheduler import Scheduler
from splash_core.profiles import load
from splash_core.results import make_result, write_result

TARGET_US = 100.0


def time_calls(fn, calls: int) -> tuple[list[float], float]:
    """Wall-clock µs of each call, and mean process CPU µs per call."""
    for _ in range(min(50, calls)):
        fn()  # warm-up
    wall = []
    cpu0 = time.process_time()
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        wall.append((time.perf_counter() - start) * 1e6)
    return wall, (time.process_time() - cpu0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="h200-x8-deepseek-v3.2")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-context", type=int, default=128 * 1024)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results", help="results root (default bench/results)")
    args = ap.parse_args()

    dep = load("deployment", args.deployment)
    scheduler = Scheduler(dep)
    rng = np.random.default_rng(args.seed)
    contexts = rng.integers(1, args.max_context + 1, size=args.requests)
    owners = np.arange(args.requests) % dep.T
    ctx_list, owner_list = contexts.tolist(), owners.tolist()
    x = BatchArrays.of(contexts, owners)
    rows = np.where(np.arange(args.requests) % 4 == 0, 512, 1)
    x_prefill = BatchArrays.of(contexts + rows, owners, query_rows=rows)
    current = Layout(scheduler.decide(x, dep.initial_layout).layout)  # decide from where π would be
    label = f"{args.requests} running"
    cases = {
        f"decide, {label}": lambda: scheduler.decide(x, current),
        f"arrays + decide, {label}": lambda: scheduler.decide(BatchArrays.of(ctx_list, owner_list), current),
        f"evaluate, {label}": lambda: scheduler.cost.evaluate(x),
        f"decide, prefill, {label}": lambda: scheduler.decide(x_prefill, current),
    }
    samples, rows_out, cpu = [], [], {}
    for case, fn in cases.items():
        wall, cpu[case] = time_calls(fn, args.calls)
        samples += [{"case": case, "us": us} for us in wall]
        rows_out.append({"case": case, "p50_us": float(np.percentile(wall, 50)),
                         "p95_us": float(np.percentile(wall, 95)), "runs": len(wall)})
    decision = scheduler.decide(x, current)
    result = make_result(
        benchmark="scheduler_speed", platform="cpu", backend="none (pure cost model)", model=dep.model.name,
        T=dep.T, dtype=dep.compute_dtype, samples=samples, summary={"cases": rows_out},
        notes=(f"{args.deployment}; contexts uniform in [1, {args.max_context}] (seed {args.seed}), round-robin "
               f"owners; decisions stay in {current} ({decision.reason}); target < {TARGET_US:g} µs per decision"),
        extra={"cpu_us_per_call": cpu, "target_us": TARGET_US,
               "workload": {"requests": args.requests, "max_context": args.max_context, "seed": args.seed}},
    )
    path = write_result(result, args.out)
    for row in rows_out:
        print(f"{row['case']:<40} p50 {row['p50_us']:7.1f} µs  p95 {row['p95_us']:7.1f} µs  "
              f"cpu {cpu[row['case']]:7.1f} µs/call")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
