#!/usr/bin/env python
"""The serving engine end to end (issue 7): a rollout under SPLASH and under each fixed layout,
and the paper's fixed-layout protocol at a few (B, L) points.

On the lent nvidia-h200-x2 machine (T = 2, DeepSeek-V3 dims, 4 layers; install the backends
first: ``pip install --no-deps -e backends/cuda -e backends/hopper``)::

    python bench/engine_bench.py --out $OUT --budget-s 200

1. Warm-up, untimed: a few short jobs in every layout and one switching through all 12
   directions, so kernel compilation and the side communicator are not timed.
2. Rollout (``--rollout``, default ``rollout-h200x2``): served under SPLASH (the scheduler
   switching live; outputs checked against the single-device reference on the cheapest requests)
   and under each fixed layout: same requests, admission and batch composition. ``--rounds``
   (default 3) rounds of all five, the order reversed every other round; per policy the run of
   median throughput is reported, every run is kept as a sample. Runs of one policy spread by
   several percent on a shared host, and the first run of a layout compiles kernels for the
   rollout's shapes that the short warm-up does not reach.
3. Fixed-layout sweep (``--sweep``): each (B, L) workload served in each layout, the paper's
   protocol (B requests at concurrency B, input L) with 128 output tokens instead of 1,024 to
   fit the GPU budget.

Every run is one engine job (``splash run``'s code path) on one pool of ranks; a run that would
start after ``--budget-s`` is skipped and listed. Writes ``<out>/<platform>/rollout_serving.json``
and ``fixed_layout_sweep.json`` through :mod:`splash_core.results`, prints a table and SPLASH's
throughput over the best fixed layout. ``--smoke`` runs the same code with the tiny model on CPU
gloo ranks in seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_core import results  # noqa: E402
from splash_core.engine import Job, serve  # noqa: E402
from splash_core.engine.policy import ScriptedPolicy  # noqa: E402
from splash_core.layouts import LAYOUTS, Layout  # noqa: E402
from splash_core.profiles import load  # noqa: E402
from splash_core.runtime.spawn import RankError, RankPool  # noqa: E402

SPLASH = "SPLASH"
TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP
ALL_DIRECTIONS = (TP, DP, TP, CP, TP, DOP, DP, CP, DP, DOP, CP, DOP, TP)  # every ordered pair once
SMOKE_ROLLOUT = {"kind": "workload", "name": "rollout-smoke", "seed": 7,
                 "rollout": {"requests": 6, "prompt_tokens": [32, 160], "output_tokens": [2, 6],
                             "long_tail_requests": 1, "long_tail_tokens": [16, 24]}}  # switches TP -> CP
SMOKE_SWEEP = ({"kind": "workload", "name": "sweep-b4-64-out4", "sweep": {"requests": 4, "input_tokens": 64,
                                                                            "output_tokens": 4}},
               {"kind": "workload", "name": "sweep-b4-160-out4", "sweep": {"requests": 4, "input_tokens": 160,
                                                                             "output_tokens": 4}},
               {"kind": "workload", "name": "sweep-b8-64-out4", "sweep": {"requests": 8, "input_tokens": 64,
                                                                            "output_tokens": 4}})


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results", help="results root; files go to <out>/<platform>/")
    p.add_argument("--deployment", default="h200-x2-deepseek-v3")
    p.add_argument("--rollout", default="rollout-h200x2", help="workload served under SPLASH and each fixed layout")
    p.add_argument("--sweep", default="sweep-b16-2k-out128,sweep-b16-8k-out128,sweep-b64-2k-out128",
                   help="comma-separated sweep workloads, each served in every layout")
    p.add_argument("--rounds", type=int, default=3, help="rollout rounds (SPLASH and every fixed layout each, in "
                   "alternating order); per policy the median run is reported")
    p.add_argument("--prefill-chunk", type=int, default=8192, help="prefill rows per owner rank per step")
    p.add_argument("--platform", default=None, help="results folder (default: <hardware platform>x<T>)")
    p.add_argument("--budget-s", type=float, default=200.0, help="start no run after this many seconds")
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU gloo ranks: checks this script's logic")
    args = p.parse_args(argv)
    args.started = time.monotonic()  # the budget counts from here: starting the ranks is part of it
    args.sweep = [w for w in args.sweep.split(",") if w]
    if args.smoke:
        args.deployment, args.rollout, args.sweep = "cpu-tiny", SMOKE_ROLLOUT, list(SMOKE_SWEEP)[:2]
        args.rounds = min(args.rounds, 2)
    return args


def warmup_jobs(args) -> list[Job]:
    """Short untimed jobs: prefill and decode in every layout, then every switch direction."""
    scale = 1 if args.smoke else 8
    small = {"kind": "workload", "name": "warm-up", "seed": 1,
             "rollout": {"requests": 4, "prompt_tokens": [20 * scale, 90 * scale], "output_tokens": [12, 16]}}
    jobs = [] if args.smoke else [Job(args.deployment, small, policy=str(layout), prefill_chunk=args.prefill_chunk,
                                      check=False) for layout in LAYOUTS]
    return jobs + [Job(args.deployment, small, policy=ScriptedPolicy(ALL_DIRECTIONS, every=1),
                       prefill_chunk=args.prefill_chunk, check=False)]


class Runner:
    """Runs jobs on one pool while the budget lasts: a run starts only if it is expected to end
    before the deadline (``expected_s``: the wall time of a like run). Remembers what it skipped
    or lost and each run's wall time (model build and check included) by label."""

    def __init__(self, pool, budget_s: float):
        self.pool, self.deadline = pool, time.monotonic() + budget_s
        self.skipped: list[str] = []
        self.wall: dict[str, float] = {}
        self.failed = ""

    def run(self, label: str, job: Job, expected_s: float = 0.0):
        if self.failed or time.monotonic() + expected_s > self.deadline:
            self.skipped.append(label)
            print(f"{label:40s} skipped ({'an earlier run failed' if self.failed else 'budget'})", flush=True)
            return None
        t0 = time.monotonic()
        try:
            summary = self.pool.run(serve, job)[0]
            self.wall[label] = time.monotonic() - t0
        except RankError as exc:
            self.failed = f"{label}: rank {exc.rank}: {str(exc).strip().splitlines()[-1]}"
            print(f"{label:40s} FAILED\n{exc}", flush=True)
            return None
        check = "" if summary.check is None else f"  check: {summary.check['line']}"
        print(f"{label:40s} {summary.tokens_per_s:12,.0f} tokens/s  {summary.elapsed_s:7.2f} s  "
              f"{summary.steps:5d} steps  {len(summary.done_switches)} switches  "
              f"{', '.join(f'{k} {v}' for k, v in summary.layout_steps.items())}{check}", flush=True)
        return summary


def rollout(args, runner: Runner) -> list[dict]:
    """``--rounds`` rounds of SPLASH and each fixed layout on the rollout workload, the order
    reversed every other round: per round {policy: RunSummary} (runs the budget skipped are
    missing). Only the first SPLASH run is checked against the reference."""
    policies = [SPLASH, *map(str, LAYOUTS)]
    rounds, expected = [], 0.0
    for r in range(args.rounds):
        out = {}
        for policy in policies if r % 2 == 0 else policies[::-1]:
            summary = runner.run(f"rollout {policy} (round {r + 1})",
                                 Job(args.deployment, args.rollout, policy=policy.lower() if policy == SPLASH else policy,
                                     prefill_chunk=args.prefill_chunk, check=policy == SPLASH and r == 0),
                                 expected_s=expected)
            if summary is not None:
                out[policy] = summary
                expected = max(expected, summary.elapsed_s)
        rounds.append(out)
    return rounds


def median_runs(rounds: list[dict]) -> dict:
    """Per policy, its run of median throughput over the rounds (the lower median for an even
    count): run-to-run spread on a shared host is several percent, and an order effect
    (kernels compiled by whichever runs first) cancels over rounds in alternating order."""
    out = {}
    for policy in dict.fromkeys(p for runs in rounds for p in runs):
        runs = sorted((r[policy] for r in rounds if policy in r), key=lambda s: s.tokens_per_s)
        out[policy] = runs[(len(runs) - 1) // 2]
    return out


def sweep(args, runner: Runner) -> dict:
    """{(workload, layout): RunSummary} of the fixed-layout protocol."""
    out = {}
    for ref in args.sweep:
        workload = load("workload", ref)
        previous = 0.0
        for layout in LAYOUTS:
            label = f"{workload.name} {layout}"
            summary = runner.run(label, Job(args.deployment, ref, policy=str(layout), prefill_chunk=args.prefill_chunk,
                                            check=False), expected_s=previous)
            previous = runner.wall.get(label, previous)
            if summary is not None:
                out[(workload.name, str(layout))] = summary
    return out


def rollout_result(args, rounds: list[dict], platform: str, skipped: list[str]) -> dict | None:
    runs = median_runs(rounds)
    fixed = {p: s for p, s in runs.items() if p != SPLASH}
    if SPLASH not in runs or not fixed:
        return None
    splash = runs[SPLASH]
    best = max(fixed, key=lambda p: fixed[p].tokens_per_s)
    rows = [{"policy": p, "tokens_per_s": s.tokens_per_s, "elapsed_s": s.elapsed_s, "steps": s.steps,
             "switches": len(s.done_switches), "served": s.served,
             "layout_steps": ", ".join(f"{k} {v}" for k, v in s.layout_steps.items())} for p, s in runs.items()]
    ratio = splash.tokens_per_s / fixed[best].tokens_per_s
    checked = rounds[0][SPLASH].check if SPLASH in rounds[0] else None
    counts = {p: sum(p in r for r in rounds) for p in runs}
    notes = (f"prefill chunk {args.prefill_chunk} rows per owner rank; per policy the run of median throughput "
             f"over {max(counts.values())} rounds in alternating order (samples carry every run, with its round); "
             f"reference check of the first SPLASH run: {checked['line'] if checked else 'skipped'}")
    if skipped:
        notes += f"; not run (budget or failure): {', '.join(skipped)}"
    return _result(args, "rollout_serving", platform, splash,
                   samples=[{**s.as_dict(), "policy": p, "round": i + 1}
                            for i, runs_i in enumerate(rounds) for p, s in runs_i.items()],
                   summary={"workload": splash.workload, "output_tokens": splash.output_tokens, "best_fixed": best,
                            "splash_over_best_fixed": ratio, "policies": rows}, notes=notes)


def sweep_result(args, runs: dict, platform: str, skipped: list[str]) -> dict | None:
    if not runs:
        return None
    specs = {w.name: w.sweep for w in (load("workload", ref) for ref in args.sweep)}
    points, samples = [], []
    for (name, layout), s in runs.items():
        spec = specs[name]
        for label in _sweep_labels(spec, specs):
            row = {"sweep": label, "layout": layout, "batch": spec.requests, "input_tokens": spec.input_tokens,
                   "tokens_per_s": s.tokens_per_s}
            points.append({**row, "runs": 1})
            samples.append({**row, "elapsed_s": s.elapsed_s, "steps": s.steps})
    outputs = {spec.output_tokens for spec in specs.values()}
    notes = (f"the paper's protocol with {', '.join(map(str, sorted(outputs)))} output tokens per request instead "
             f"of 1,024 (GPU time budget); one run per point; prefill chunk {args.prefill_chunk} rows per owner rank")
    if skipped:
        notes += f"; not run: {', '.join(skipped)}"
    any_run = next(iter(runs.values()))
    summary = {"points": points}
    if len(outputs) == 1:
        summary["output_tokens"] = outputs.pop()
    return _result(args, "fixed_layout_sweep", platform, any_run, samples=samples, summary=summary, notes=notes)


def _sweep_labels(spec, specs: dict) -> list[str]:
    """The panels a point belongs to: the input-length sweep at its B, the batch sweep at its L
    (each only when it has more than one position)."""
    labels = []
    if sum(s.requests == spec.requests for s in specs.values()) > 1:
        labels.append(f"Input-length sweep, B = {spec.requests}")
    if sum(s.input_tokens == spec.input_tokens for s in specs.values()) > 1:
        labels.append(f"Batch sweep, L = {spec.input_tokens:,}")
    return labels or [f"B = {spec.requests}, L = {spec.input_tokens:,}"]


def _result(args, benchmark: str, platform: str, run, *, samples, summary, notes) -> dict:
    return results.make_result(benchmark=benchmark, platform=platform, backend=run.backend, model=run.model, T=run.T,
                               dtype=run.compute_dtype, samples=samples, summary=summary,
                               notes=f"{run.layers} layers of {run.model}; {notes}")


def run(args, pool) -> int:
    """The benchmark on a live pool of the deployment's T ranks; returns the exit code."""
    deployment = load("deployment", args.deployment)
    platform = args.platform or (f"{deployment.hardware.platform}x{deployment.T}" if deployment.T > 1
                                 else deployment.hardware.platform)
    runner = Runner(pool, args.budget_s - (time.monotonic() - args.started))
    for job in warmup_jobs(args):
        summary = runner.run(f"warm-up {job.policy if isinstance(job.policy, str) else 'switches'}", job)
        if summary is not None and summary.device == "cpu" and not args.smoke:
            raise SystemExit("the deployment's backend resolved to the CPU reference; install the accelerator "
                             "backends (pip install --no-deps -e backends/cuda -e backends/hopper) or pass --smoke")
    done = len(runner.skipped)
    rounds = rollout(args, runner)
    rollout_skipped, done = runner.skipped[done:], len(runner.skipped)
    points = sweep(args, runner)
    sweep_skipped = runner.skipped[done:]
    written = []
    for data in (rollout_result(args, rounds, platform, rollout_skipped),
                 sweep_result(args, points, platform, sweep_skipped)):
        if data is not None:
            written.append(results.write_result(data, args.out))
            if data["benchmark"] == "rollout_serving":
                s = data["summary"]
                print(f"\nSPLASH / best fixed layout ({s['best_fixed']}) on {s['workload']}: "
                      f"{s['splash_over_best_fixed']:.3f}x  (measured, T = {deployment.T}, median run of "
                      f"{len(rounds)} rounds; "
                      f"the paper reports 1.3-1.73x on B200 at T = 8)")
    for path in written:
        print("wrote", path)
    print(f"total {time.monotonic() - args.started:.0f} s", flush=True)
    check_failed = bool(rounds) and SPLASH in rounds[0] and rounds[0][SPLASH].check_passed is False
    return 1 if runner.failed or check_failed else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    deployment = load("deployment", args.deployment)
    with RankPool(deployment.T, backend="reference" if args.smoke else deployment.backend,
                  timeout_s=deployment.collective_timeout_s) as pool:
        return run(args, pool)


if __name__ == "__main__":
    sys.exit(main())
