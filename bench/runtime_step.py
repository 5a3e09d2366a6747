#!/usr/bin/env python
"""The distributed MLA runtime on real collectives: equivalence, then one timed prefill and one
timed decode step per layout (issue 4).

On the lent nvidia-h200-x2 machine (T = 2, NCCL through the selected backend)::

    python bench/runtime_step.py --out $OUT

1. Equivalence in bf16: tiny-mla (3 layers, chunked prefill + 21 greedy tokens) and DeepSeek-V3
   dims (first 2 layers) in every layout against a float32 reference on rank 0 that uses the same
   bf16-rounded weights, teacher-forced with the reference's tokens. Stated tolerance: max
   |logit error| <= --tolerance (default 0.05) x max |reference logit|, and greedy tokens agree
   except where the reference's top-2 margin is within twice that error.
2. Timing with DeepSeek-V3 attention dims: B = 16 balanced requests (``--batches``: one or more
   batch sizes) at each context (8K, 32K, 128K by default) over a synthetic history; one decode
   step (1 row per request) and one prefill chunk (--prefill-chunk rows per request) per layout,
   with as many layers as fit in the busiest layout at the largest batch and context (computed
   from the ownership footprint; --max-layers caps it). The runtime as it serves: the backend's
   fused small ops, decode steps replayed from captured graphs where the backend captures them
   (``--graphs``; each sample's ``path`` says how it ran), prefill eagerly. Step time per
   repetition is the slowest rank's wall time, device synchronised.

``--calibrate`` first runs ``splash calibrate`` with the same backend, ranks and ``--graphs``
into ``<out>/<platform>/<name>-hardware.yaml`` (θ of this machine's runtime, measured in the
same run), which ``bench/costmodel_check.py`` then predicts these steps with. θ from the
machine at T = 1 on one H200, in one command (about 4 minutes)::

    python bench/runtime_step.py --T 1 --batches 1,16,64 --reps 5 --warmup 2 --budget-s 200 \
        --calibrate --skip-equivalence --name runtime_step-t1 --out $OUT

Writes ``<out>/<platform>/runtime_equivalence.json`` and ``<name>.json`` (``runtime_step.json``) through
:mod:`splash_core.results` and prints a table. Exit code 1 if a layout fails equivalence.
``--smoke`` runs the same code on tiny shapes (CPU, gloo) in seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_bench import step as step_bench  # noqa: E402
from splash_core import dtypes, results  # noqa: E402
from splash_core.cli.main import main as splash  # noqa: E402
from splash_core.layouts import Layout  # noqa: E402
from splash_core.platform.backend import get_backend  # noqa: E402
from splash_core.profiles.loader import load  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402
from splash_core.studies.calibrate_runtime import GRAPH_MODES  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results", help="results root; files go to <out>/<platform>/")
    p.add_argument("--T", type=int, default=2, help="ranks (one per device)")
    p.add_argument("--backend", default="auto", help="backend plugin (auto: the accelerator's, else reference)")
    p.add_argument("--kernels", choices=("backend", "reference"), default="backend",
                   help="MLA kernels: the backend's, or the torch reference on the backend's device")
    p.add_argument("--platform", default=None, help="results folder (default: the backend's hardware profile)")
    p.add_argument("--model", default="deepseek-v3", help="model profile for the timing")
    p.add_argument("--dtype", default="bf16", help="compute and KV format")
    p.add_argument("--batches", default="16", help="comma-separated batch sizes (requests per step)")
    p.add_argument("--graphs", choices=GRAPH_MODES, default="auto",
                   help="decode steps replay captured graphs: auto (where the backend captures them), on (the "
                        "backend must), off (eager); prefill runs eagerly")
    p.add_argument("--calibrate", action="store_true",
                   help="first run `splash calibrate` (same backend, ranks, --graphs) into <out>/<platform>/<name>-hardware.yaml")
    p.add_argument("--name", default="runtime_step", help="file name (stem) of the timing result")
    p.add_argument("--contexts", default="8192,32768,131072", help="comma-separated history lengths")
    p.add_argument("--prefill-chunk", type=int, default=16, help="query rows per request in the prefill step")
    p.add_argument("--page-size", type=int, default=64)
    step_bench.add_memory_options(p, margin_gib=2.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--matmul-precision", default="high", choices=("highest", "high", "medium"),
                   help="float32 matmul precision while timing (the torch reference kernels compute in float32; "
                        "equivalence always runs at 'highest')")
    p.add_argument("--budget-s", type=float, default=130.0, help="skip timing cases that would start after this")
    p.add_argument("--skip-equivalence", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks this script's logic")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.smoke:
        args.backend, args.model, args.contexts = "reference", "tiny-mla", "48,96"
        args.batches = "4" if args.batches == "16" else args.batches
        args.page_size, args.prefill_chunk, args.reps, args.platform = 16, 8, 2, args.platform or "cpu"
        args.margin_gib = 0.0
    args.contexts = sorted(int(c) for c in str(args.contexts).split(","))
    args.batches = sorted(int(b) for b in str(args.batches).split(","))
    if min(args.batches) < 1:
        p.error(f"--batches must be positive (got {args.batches})")
    if min(args.contexts) <= args.prefill_chunk:
        p.error(f"every context must exceed --prefill-chunk {args.prefill_chunk}")
    return args


def equivalence_specs(args) -> list[dict]:
    layouts = [str(l) for l in Layout]
    common = dict(dtype=args.dtype, seed=args.seed, layouts=layouts, kernels=args.kernels, tolerance=args.tolerance)
    tiny = dict(model="tiny-mla", layers=None, prompts=[37, 5, 20, 1, 50], new_tokens=21, chunk=16, page_size=16)
    if args.smoke:
        return [{**common, **tiny, "new_tokens": 6}]
    big = dict(model="deepseek-v3", layers=2, prompts=[70, 3, 130], new_tokens=4, chunk=64, page_size=64)
    return [{**common, **tiny}, {**common, **big}]


def run(args, pool, calibrated: str | None = None) -> int:
    """Equivalence and timing on ``pool``; ``calibrated``: the file name (in the results folder)
    of the profile ``--calibrate`` wrote, recorded in the summary."""
    start = time.time()
    info = pool.run(step_bench.describe_rank)
    platform = args.platform or info[0]["profile"] or "cpu"
    print(f"{args.T} ranks, backend {info[0]['backend']} on {info[0]['device']}, kernels {args.kernels}", flush=True)
    if args.backend == "auto" and info[0]["device"] == "cpu" and not args.smoke:
        raise SystemExit("backend auto found no accelerator backend and chose the CPU reference; install one "
                         "(pip install --no-deps -e backends/cuda -e backends/hopper) or pass --backend reference")
    failed = []
    if not args.skip_equivalence:
        rows = []
        for spec in equivalence_specs(args):
            metrics = pool.run(step_bench.check_equivalence, spec)[0]
            for layout, m in metrics.items():
                rows.append({"model": spec["model"], "layout": layout, **m})
                print(f"equivalence {spec['model']:12s} {layout:4s} rel err {m['rel_err']:.2e} "
                      f"mismatches {m['greedy_mismatches']} (decisive {m['decisive_mismatches']}) "
                      f"{'ok' if m['passed'] else 'FAILED'}", flush=True)
        failed = [f"{r['model']}/{r['layout']}" for r in rows if not r["passed"]]
        data = results.make_result(
            benchmark="runtime_equivalence", platform=platform, backend=info[0]["backend"], model="tiny-mla+deepseek-v3",
            T=args.T, dtype=args.dtype, samples=rows,
            summary={"passed": not failed, "failed": failed, "tolerance": args.tolerance, "kernels": args.kernels},
            notes="float32 reference on rank 0 with the same rounded weights; teacher-forced greedy decoding")
        print("wrote", results.write_result(data, args.out), flush=True)

    profile = load("model", args.model)
    elem = dtypes.nbytes(args.dtype)
    memory = [i["memory"] for i in info]
    budget = (min(m[0] for m in memory) * args.memory_fraction if all(memory) else args.cpu_budget_gib * (1 << 30))
    fit, accounting = step_bench.layers_that_fit(profile, args.T, max(args.batches), max(args.contexts),
                                                 args.page_size, elem, budget, args.prefill_chunk, args.margin_gib)
    layers = min(fit, args.max_layers) if args.max_layers else fit
    if layers < 1:
        raise SystemExit(f"not even one layer fits: {json.dumps(accounting)}")
    print(f"{fit} layers fit the busiest layout at B = {max(args.batches)} x {max(args.contexts)} tokens; "
          f"timing {layers}", flush=True)
    deadline = time.time() + args.budget_s
    samples = []
    for batch in args.batches:
        for layout in Layout:
            spec = dict(model=args.model, layout=str(layout), layers=layers, batch=batch, contexts=args.contexts,
                        prefill_chunk=args.prefill_chunk, page_size=args.page_size, dtype=args.dtype, seed=args.seed,
                        kernels=args.kernels, reps=args.reps, warmup=args.warmup, deadline=deadline,
                        matmul_precision=args.matmul_precision, graphs=args.graphs)
            per_rank = pool.run(step_bench.measure_layout, spec)
            for i, sample in enumerate(per_rank[0]):
                if "step_ms" in sample:  # the step's time is the slowest rank's
                    sample = {**sample, "step_ms": [max(r[i]["step_ms"][k] for r in per_rank)
                                                    for k in range(len(sample["step_ms"]))]}
                samples.append({**sample, "batch": batch})
                print(_line(samples[-1]), flush=True)
    timed = [s for s in samples if "step_ms" in s]
    summary = {"layers": layers, "layers_fit": fit, "memory": accounting, "graphs": args.graphs, "points": [
        {"layout": s["layout"], "phase": s["phase"], "context": s["context"], "batch": s["batch"],
         "rows": s["rows"], "path": s["path"], "median_ms": statistics.median(s["step_ms"])} for s in timed],
        "skipped": [f"{s['layout']}/{s['phase']}/B={s['batch']}/{s['context']}" for s in samples if "skipped" in s]}
    if calibrated:
        summary["calibrated_profile"] = calibrated
    data = results.make_result(
        benchmark="runtime_step", platform=platform, backend=info[0]["backend"], model=args.model, T=args.T,
        dtype=args.dtype, samples=timed or samples, summary=summary,
        notes=f"kernels: {args.kernels}; backend's fused small ops; decode graphs {args.graphs} (each sample's path: "
              f"replay, static or eager); float32 matmul precision {args.matmul_precision}; synthetic history; "
              f"prefill = one chunk of {args.prefill_chunk} rows per request, eager; step time = slowest rank"
              + (f"; theta calibrated in the same run: {calibrated}" if calibrated else ""))
    print("wrote", results.write_result(data, args.out, args.name), f"({time.time() - start:.0f} s)", flush=True)
    return 1 if failed else 0


def _line(s: dict) -> str:
    if "skipped" in s:
        return f"{s['layout']:4s} {s['phase']:7s} B={s['batch']:<3d} {s['context']:>7d}  skipped ({s['skipped']})"
    return (f"{s['layout']:4s} {s['phase']:7s} B={s['batch']:<3d} {s['context']:>7d}  rows={s['rows']} "
            f"layers={s['layers']} {s['path']:6s} median {statistics.median(s['step_ms']):9.2f} ms")


def calibrate(args) -> str:
    """``splash calibrate`` of this run's backend, ranks and graphs into the results folder (before
    the timing's ranks start, so the two never share a device); the profile's file name."""
    platform = args.platform or get_backend(args.backend).hardware_profile() or "cpu"
    folder = Path(args.out) / platform
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{args.name}-hardware.yaml"
    command = ["calibrate", "--backend", args.backend, "--ranks", str(args.T), "--graphs", args.graphs,
               "--dtype", args.dtype, "--out", str(folder / name), "--force"]
    command += ["--quick"] if args.smoke else []
    print("splash", " ".join(command), flush=True)
    if splash(command) != 0:
        raise SystemExit("splash calibrate failed (above)")
    return name


def main(argv=None) -> int:
    args = parse_args(argv)
    calibrated = calibrate(args) if args.calibrate else None
    with RankPool(args.T, backend=args.backend, timeout_s=600) as pool:
        return run(args, pool, calibrated)


if __name__ == "__main__":
    sys.exit(main())
