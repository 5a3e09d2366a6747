#!/usr/bin/env python
"""Host time of rank 0's decisions while a pre-copy runs in ``--switch-mode auto`` (issue 26).

The scheduler asks for the switch on every step of the pre-copy it chose. Each case times the
decisions of whole pre-copy windows (the step that chooses the pre-copy of k steps, the k steps
beside it, the handoff) on a decode batch of ``--requests`` requests at ``--context`` tokens
growing by one a step, from the first layout the scheduler leaves by a pre-copy:

- ``replan``: the scheduler's decision and the transition planned afresh every step (what
  :class:`~splash_core.engine.policy.SchedulerPolicy` did before it kept its choice);
- ``policy``: :meth:`SchedulerPolicy.decide`, which plans the transition once per window.

Samples are wall-clock microseconds per decision (``window`` numbers them); the summary gives
each case's p50/p95 per decision and ``extra`` the mean per window.

    python bench/precopy_planning.py [--deployment h200-x8-deepseek-v3.2] [--requests 16] [--windows 50]

Writes ``<out>/cpu/precopy_planning.json`` (schema: docs/results.md, ``precopy_planning``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from splash_core.engine.policy import SchedulerPolicy
from splash_core.layouts import LAYOUTS
from splash_core.planning.costmodel import BatchArrays
from splash_core.planning.precopy_time import plan_transition
from splash_core.profiles import load
from splash_core.results import make_result, write_result


def decode(deployment, requests: int, context: int) -> BatchArrays:
    return BatchArrays.of([context] * requests, [i % deployment.T for i in range(requests)],
                          query_rows=[1] * requests, ids=list(range(requests)), reserved=[context + 1024] * requests)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="h200-x8-deepseek-v3.2")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--precopy-steps", type=int, default=8, help="the longest pre-copy the policy may choose")
    ap.add_argument("--windows", type=int, default=50)
    ap.add_argument("--out", default="bench/results", help="results root (default bench/results)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    dep = load("deployment", args.deployment)
    x0 = decode(dep, args.requests, args.context)
    probe = SchedulerPolicy(dep, args.precopy_steps)
    choices = {src: probe.decide(x0, src, float("inf"), 0) for src in LAYOUTS}
    src = next((s for s, c in choices.items() if c.precopy_steps), None)
    if src is None:
        raise SystemExit(f"no layout is left by a pre-copy at {args.requests} x {args.context} tokens: "
                         + "; ".join(f"{s}: {c.reason}" for s, c in choices.items()))
    k = choices[src].precopy_steps
    batches = [decode(dep, args.requests, args.context + j) for j in range(k + 1)]

    def replan(step: int, x) -> None:
        s = probe.scheduler
        d = s.decide(x, src, float("inf"))
        plan_transition(x, src, d.layout, s.cost, d.estimates, args.precopy_steps, probe.interference,
                        layers=s.layers)

    samples, per_window = [], {"replan": [], "policy": []}
    for window in range(args.windows + 1):  # the first window warms up
        policy = SchedulerPolicy(dep, args.precopy_steps)
        cases = {"replan": replan, "policy": lambda step, x: policy.decide(x, src, float("inf"), step)}
        for case, fn in cases.items():
            total = 0.0
            for step, x in enumerate(batches):
                t0 = time.perf_counter()
                fn(step, x)
                us = (time.perf_counter() - t0) * 1e6
                total += us
                if window:
                    samples.append({"case": case, "us": us, "window": window, "step": step})
            if window:
                per_window[case].append(total)
    rows = []
    for case in per_window:
        us = [s["us"] for s in samples if s["case"] == case]
        rows.append({"case": case, "p50_us": float(np.percentile(us, 50)), "p95_us": float(np.percentile(us, 95)),
                     "runs": len(us)})
    window_us = {case: float(np.mean(v)) for case, v in per_window.items()}
    result = make_result(
        benchmark="precopy_planning", platform="cpu", backend="none (pure cost model)", model=dep.model.name, T=dep.T,
        dtype=dep.compute_dtype, samples=samples, summary={"cases": rows},
        notes=(f"{args.deployment}; decode, {args.requests} requests x {args.context} tokens; {src} -> "
               f"{choices[src].layout} by a pre-copy of {k} steps (of up to {args.precopy_steps}): {k + 1} decisions "
               f"a window"),
        extra={"mean_us_per_window": window_us, "src": str(src), "dst": str(choices[src].layout),
               "precopy_steps": k, "workload": {"requests": args.requests, "context": args.context}})
    for row in rows:
        print(f"{row['case']:<8} p50 {row['p50_us']:9.1f} µs  p95 {row['p95_us']:9.1f} µs per decision; "
              f"{window_us[row['case']]:10.1f} µs per window of {k + 1}")
    if not args.no_write:
        print(f"wrote {write_result(result, args.out)}")


if __name__ == "__main__":
    main()
