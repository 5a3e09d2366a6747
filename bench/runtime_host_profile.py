#!/usr/bin/env python
"""Host time of the distributed runtime's forward path, per layer and layout, on CPU.

On an accelerator one decode step of the runtime is bounded by the host (Python, small
operations, host-to-device copies, synchronisations), not by the device. This benchmark
measures that host work where no accelerator is needed: the reference backend on T gloo ranks
(``RankPool``), a model with DeepSeek-V3's structure at tiny widths (see
``bench/host_profile_ranks.py``), B = 16 requests with long histories, in every layout: a
decode step, a decode step in which a page opens (serving), and a prefill chunk.

Reported per layout and step kind, for the slowest rank. A *steady* layer is any but the first
(which also makes the tensors the step's layers share) and the last (whose span also holds the
LM head); per-layer figures are means over steady layers. Host times are the rank's CPU time,
the least over all repetitions of all rounds, so that ranks sharing cores (with each other or
anything else) count neither waiting nor, as far as possible, interference as work:

- ``runtime_us``: a steady layer's host time outside the attention kernels and the collectives
  (what this runtime adds); ``first_layer_us``: the same for the first layer;
- ``kernel_us``: time inside the reference attention kernels (CPU math; on an accelerator a
  kernel launch), shown apart because it is not the runtime's;
- ``collective_us``: time inside collectives (on an accelerator an asynchronous launch), also
  apart; ``collectives``: calls per layer;
- ``aten_ops``: torch operations a layer issues outside kernels and collectives (kernel
  launches and views on an accelerator);
- ``host_copies`` per layer and ``step_copies`` per step: host arrays turned into tensors
  (host-to-device copies on an accelerator; synchronous unless staged in pinned memory);
- ``host_reads``: tensor values read on the host in the whole step (synchronisations there);
- ``step_ms``: the step's wall time, median over repetitions (kernels, collectives and waiting
  included).

``--baseline-tree DIR`` measures another checkout of the project (the code before a change)
in the same rounds, alternating with this one, and adds its numbers as ``before_*`` to each
row; its ranks import that tree's ``splash_core`` (the rank-side code uses only the runtime's
public API). ``--profile-out FILE`` writes rank 0's ``cProfile`` listing of one step per case::

    mkdir -p /tmp/base && git archive 858c895 | tar -x -C /tmp/base
    python bench/runtime_host_profile.py --baseline-tree /tmp/base --profile-out /tmp/host_profile.txt

Writes ``<out>/<platform>/runtime_host_profile.json`` through :mod:`splash_core.results`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
if __name__ != "__mp_main__":  # ranks keep the path they were started with (see --baseline-tree)
    sys.path[:0] = [str(BENCH.parent), str(BENCH)]  # run from a checkout without installing

from splash_bench import host_profile_ranks  # noqa: E402
from splash_core import results  # noqa: E402
from splash_core.layouts import Layout  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402

COMPARED = ("runtime_us", "first_layer_us", "step_ms", "aten_ops", "host_copies", "step_copies", "host_reads",
            "collectives")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    p.add_argument("--platform", default="cpu")
    p.add_argument("--T", type=int, default=2)
    p.add_argument("--backend", default="reference")
    p.add_argument("--kernels", choices=("backend", "reference"), default="reference")
    p.add_argument("--dtype", default="bf16", help="compute and KV format")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=2048, help="tokens of history per request after the step")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--chunk", type=int, default=16, help="prefill rows per request")
    p.add_argument("--reps", type=int, default=5, help="timed steps per case and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all layouts (baseline and this tree alternate)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layouts", default=",".join(str(l) for l in Layout))
    p.add_argument("--baseline-tree", type=Path,
                   help="another checkout of the project (e.g. `git archive <commit> | tar -x -C DIR`), measured "
                        "in the same rounds: its numbers become before_*")
    p.add_argument("--baseline-label", help="what the baseline tree is (default: its path)")
    p.add_argument("--profile-out", type=Path, help="write rank 0's cProfile listings (this tree) here")
    p.add_argument("--top", type=int, default=30, help="functions per cProfile listing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny case: checks this script's logic in seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.layers, args.batch, args.context, args.page_size, args.chunk = 3, 4, 64, 16, 4
        args.reps, args.rounds, args.warmup, args.top = 2, 1, 1, 5
    if args.layers < 3:
        p.error("--layers must be at least 3 (the first and the last layer are not steady layers)")
    if args.context % args.page_size or args.context <= args.chunk or args.page_size < 2:
        p.error("--context must be a multiple of --page-size (>= 2) and exceed --chunk")
    if args.baseline_tree is not None and not (args.baseline_tree / "splash_core" / "__init__.py").is_file():
        p.error(f"--baseline-tree {args.baseline_tree}: no splash_core package there")
    args.layouts = [Layout(l.strip().upper()) for l in args.layouts.split(",")]
    return args


def summarise(layout: str, phase: str, per_rank: list[dict]) -> tuple[dict, list[dict]]:
    """One summary row and the samples (per repetition, slowest rank) of one case. A steady
    layer is any but the first (which also makes the step's shared tensors) and the last (whose
    span also holds the LM head)."""
    reps = {}
    for rank_out in per_rank:
        for s in rank_out["samples"]:
            if s["phase"] == phase:
                reps.setdefault(s["rep"], []).append(s)
    steady = slice(1, -1)
    samples = []
    for rep, ranks in sorted(reps.items()):
        own = [np.array(s["layer_us"]) - s["kernel_us"] - s["collective_us"] for s in ranks]
        mean = lambda key: max(float(np.mean(s[key][steady])) for s in ranks)  # noqa: E731
        samples.append({"layout": layout, "phase": phase, "rep": rep, "step_ms": max(s["step_ms"] for s in ranks),
                        "layer_us": mean("layer_us"), "kernel_us": mean("kernel_us"),
                        "collective_us": mean("collective_us"),
                        "runtime_us": max(float(np.mean(o[steady])) for o in own),
                        "first_layer_us": max(float(o[0]) for o in own)})
    counts = [r["counts"][phase] for r in per_rank]
    # count buckets: [before the first layer, layer 0, ..., layer L-1, unused]; steady layers 1..L-2
    per_layer = lambda key: int(max(np.median(c[key][2:-2]) for c in counts))  # noqa: E731
    per_step = lambda key: int(max(sum(c[key]) for c in counts))  # noqa: E731
    least = lambda key: min(s[key] for s in samples)  # noqa: E731
    row = {"layout": layout, "phase": phase, "runtime_us": least("runtime_us"),
           "first_layer_us": least("first_layer_us"), "kernel_us": least("kernel_us"),
           "collective_us": least("collective_us"), "step_ms": statistics.median(s["step_ms"] for s in samples),
           "aten_ops": per_layer("ops"), "host_copies": per_layer("copies"), "step_copies": per_step("copies"),
           "collectives": per_layer("collectives"), "host_reads": per_step("reads")}
    return row, samples


def _merge_rounds(rounds: list[list[dict]]) -> list[dict]:
    """Per rank, the samples of every round (repetitions numbered on) and the first round's
    counts and profile (counts do not change between rounds)."""
    merged = []
    for rank, first in enumerate(rounds[0]):
        samples = [{**s, "rep": r * 1000 + s["rep"]} for r, per_rank in enumerate(rounds)
                   for s in per_rank[rank]["samples"]]
        merged.append({**first, "samples": samples})
    return merged


def baseline_pool(args) -> RankPool | None:
    """Ranks of the baseline tree (None without one), started with the tree first on their
    path so that they import its ``splash_core``."""
    if args.baseline_tree is None:
        return None
    tree = str(args.baseline_tree.resolve())
    sys.path.insert(0, tree)
    try:
        return RankPool(args.T, backend=args.backend, timeout_s=600)
    finally:
        sys.path.remove(tree)


def run(args, pool, base_pool=None) -> Path:
    start = time.time()
    rows, samples, listings = [], [], []
    for layout in args.layouts:
        spec = dict(layout=str(layout), layers=args.layers, batch=args.batch, context=args.context,
                    page_size=args.page_size, chunk=args.chunk, dtype=args.dtype, kernels=args.kernels,
                    reps=args.reps, warmup=args.warmup, seed=args.seed, top=args.top)
        ours, theirs = [], []
        for _ in range(args.rounds):  # alternate, so both trees meet the same load on a shared machine
            if base_pool is not None:
                theirs.append(base_pool.run(host_profile_ranks.measure, spec))
            ours.append(pool.run(host_profile_ranks.measure, spec))
        ours = _merge_rounds(ours)
        before = _merge_rounds(theirs) if theirs else None
        if before is not None and Path(before[0]["splash_core"]) != args.baseline_tree.resolve():
            raise SystemExit(f"the baseline ranks imported splash_core from {before[0]['splash_core']}, "
                             f"not from {args.baseline_tree}")
        for phase in host_profile_ranks.PHASES:
            row, rep_samples = summarise(str(layout), phase, ours)
            if before is not None:
                old, _ = summarise(str(layout), phase, before)
                row.update({f"before_{k}": old[k] for k in COMPARED})
            rows.append(row)
            samples += rep_samples
            listings.append(f"==== {layout} {phase} (rank 0, one step) ====\n{ours[0]['profile'][phase]}")
    for row in rows:
        print(_line(row), flush=True)
    workload = (f"B={args.batch}, {args.context}-token histories in {args.page_size}-token pages, "
                f"prefill {args.chunk} rows per request, {args.layers} layers")
    summary = {"workload": workload, "layers": args.layers, "points": rows}
    if base_pool is not None:
        summary["baseline"] = args.baseline_label or f"the tree at {args.baseline_tree}"
    data = results.make_result(
        benchmark="runtime_host_profile", platform=args.platform, backend=args.backend,
        model=f"tiny-deepseek ({args.layers} layers)", T=args.T, dtype=args.dtype, samples=samples, summary=summary,
        notes=f"CPU time of the runtime per steady layer (attention + MLP; attention kernels and collectives "
              f"excluded), slowest rank, least over {args.rounds} x {args.reps} repetitions; counts per steady "
              f"layer outside kernels and collectives; step_copies and host_reads per step; step_ms is the "
              f"median wall time" + ("; before_* measured in the same rounds, alternating" if base_pool else ""))
    path = results.write_result(data, args.out)
    if args.profile_out:
        args.profile_out.parent.mkdir(parents=True, exist_ok=True)
        args.profile_out.write_text("\n".join(listings))
    print("wrote", path, f"({time.time() - start:.0f} s)", flush=True)
    return path


def _line(r: dict) -> str:
    def pair(key, fmt):
        now = format(r[key], fmt)
        return f"{format(r['before_' + key], fmt)} -> {now}" if f"before_{key}" in r else now

    return (f"{r['layout']:4s} {r['phase']:11s} runtime/layer {pair('runtime_us', '.0f')} us  "
            f"first layer {pair('first_layer_us', '.0f')} us  kernels {r['kernel_us']:.0f} us  "
            f"collectives {r['collective_us']:.0f} us  step {pair('step_ms', '.1f')} ms  "
            f"ops/layer {pair('aten_ops', 'd')}  copies/layer {pair('host_copies', 'd')}  "
            f"copies/step {pair('step_copies', 'd')}  reads/step {pair('host_reads', 'd')}  "
            f"collectives/layer {pair('collectives', 'd')}")


def main(argv=None) -> int:
    args = parse_args(argv)
    base_pool = baseline_pool(args)
    try:
        with RankPool(args.T, backend=args.backend, timeout_s=600) as pool:
            run(args, pool, base_pool)
    finally:
        if base_pool is not None:
            base_pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
