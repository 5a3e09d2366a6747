#!/usr/bin/env python
"""``splash run``'s code path on one rollout with prefill attending absorbed and with the
per-request form choice (``prefill_attention: auto``, :mod:`splash_core.planning.attention_forms`): tokens/s
and the step times of prefill and decode steps, the same requests, admission and batches; and
(``--overlap on,off``) with the host planning step k+1 while the device runs step k and without.

On one H200 (issue 22's engine target: T = 1, 61 layers, the ``rollout-h200x2`` workload)::

    python bench/prefill_forms.py --out $OUT

``--smoke`` runs the same code on the tiny CPU deployment in seconds. Writes
``<out>/<platform>/prefill_forms.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import yaml

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # uninstalled checkout

from splash_core import results  # noqa: E402
from splash_core.engine import Job, serve  # noqa: E402
from splash_core.profiles import load  # noqa: E402
from splash_core.profiles.loader import find  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    p.add_argument("--deployment", default="h200-x2-deepseek-v3")
    p.add_argument("--T", type=int, default=1)
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--workload", default="rollout-h200x2")
    p.add_argument("--forms", default="absorbed,auto")
    p.add_argument("--overlap", default="on", help="on, off or on,off: plan the next step while the device runs one")
    p.add_argument("--policy", default="TP")
    p.add_argument("--prefill-chunk", type=int, default=8192)
    p.add_argument("--platform", default=None, help="results folder (default: the hardware profile's platform)")
    p.add_argument("--smoke", action="store_true", help="cpu-tiny deployment, rollout-tiny: checks the script")
    args = p.parse_args(argv)
    if args.smoke:
        args.deployment, args.workload, args.T, args.layers = "cpu-tiny", "rollout-tiny", 1, None
    return args


def deployment(args, form: str) -> dict:
    data = yaml.safe_load(Path(find("deployment", args.deployment)).read_text())
    data.update(name=f"{data['name']}-{form}", T=args.T, prefill_attention=form)
    if args.layers is not None:
        data["layers"] = args.layers
    return data


def run(pool, args, form: str, warm_up: bool = False, overlap: bool = True):
    workload = args.workload
    if warm_up:
        spec = load("workload", args.workload).rollout
        workload = {"kind": "workload", "name": "warm-up", "seed": 1,
                    "rollout": {"requests": 4, "prompt_tokens": list(spec.prompt_tokens), "output_tokens": [4, 8]}}
    job = Job(deployment(args, form), workload, policy=args.policy, prefill_chunk=args.prefill_chunk, check=False,
              overlap=overlap)
    return pool.run(serve, job)[0]


def sample(form: str, summary, overlap: bool) -> dict:
    prefill = [ms for ms, rows, reqs in zip(summary.step_ms, summary.step_rows, summary.step_requests) if rows > reqs]
    decode = [ms for ms, rows, reqs in zip(summary.step_ms, summary.step_rows, summary.step_requests) if rows == reqs]
    return {"form": form if overlap else f"{form}/no-overlap", "overlap": overlap, "booked": summary.booked,
            "tokens_per_s": summary.tokens_per_s, "elapsed_s": summary.elapsed_s,
            "steps": summary.steps, "prompt_tokens": summary.prompt_tokens, "output_tokens": summary.output_tokens,
            "prefill_steps": len(prefill), "prefill_s": sum(prefill) / 1e3,
            "prefill_step_p50_ms": statistics.median(prefill) if prefill else 0.0,
            "decode_step_p50_ms": statistics.median(decode) if decode else 0.0,
            "step_ms": list(summary.step_ms), "step_rows": list(summary.step_rows)}


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.time()
    forms = [f for f in args.forms.split(",") if f]
    probe = deployment(args, forms[0])
    with RankPool(args.T, backend=probe.get("backend", "auto"), timeout_s=900) as pool:
        for form in forms:  # untimed, a few requests of the rollout's lengths: compiles each form's kernels
            run(pool, args, form, warm_up=True)
        samples = []
        for form, overlap in [(f, o == "on") for f in forms for o in args.overlap.split(",")]:
            served = run(pool, args, form, overlap=overlap)
            got = sample(form, served, overlap)
            print(f"{got['form']:>9}: {got['tokens_per_s']:,.0f} tokens/s, {got['prefill_steps']} prefill steps "
                  f"{got['prefill_s']:.1f} s (p50 {got['prefill_step_p50_ms']:.0f} ms), decode p50 "
                  f"{got['decode_step_p50_ms']:.1f} ms", flush=True)
            samples.append(got)
    dep = load("deployment", probe)
    platform = args.platform or dep.hardware.platform
    base = samples[0]["tokens_per_s"]
    summary = {"tokens_per_s": {s["form"]: s["tokens_per_s"] for s in samples},
               "over_first": {s["form"]: s["tokens_per_s"] / base if base else 0.0 for s in samples}}
    data = results.make_result(
        benchmark="prefill_forms", platform=platform, backend=served.backend, model=dep.model.name, T=args.T,
        dtype=dep.compute_dtype, samples=samples, summary=summary,
        notes=(f"workload {args.workload}, policy {args.policy}, {dep.layers or dep.model.num_layers} layers, "
               f"seeded weights; each form first served 4 requests untimed (kernel compilation); "
               f"a prefill step is one with more rows than requests"))
    print("wrote", results.write_result(data, args.out), f"({time.time() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
