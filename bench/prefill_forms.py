#!/usr/bin/env python
"""``splash run``'s code path on one rollout with prefill attending absorbed and with the
per-request form choice (``prefill_attention: auto``, :mod:`splash_core.planning.attention_forms`): tokens/s
and the step times of prefill and decode steps, the same requests, admission and batches; and
(``--overlap on,off``) with the host planning step k+1 while the device runs step k and without.

On one H200 (issue 22's engine target: T = 1, 61 layers, the ``rollout-h200x2`` workload)::

    python bench/prefill_forms.py --out $OUT

Beside every run, its physical limit (issue 39; :mod:`splash_bench.run_roofline`): its steps'
matmul FLOPs (projections, attention by form, MLP, LM head) at the matmul rate and its decode
steps' bytes (weights read once, KV histories) at the copy rate, both rates measured in the same
process after the runs (:func:`splash_bench.decode_step.device_rates`, the decode-step roofline's
helper); ``physical_limit_s``, ``measured_s`` (the run's elapsed time), ``ratio`` (limit /
measured) and the prefill and decode parts. ``--ffn-weights fp8`` keeps the feed-forward weights
FP8 (seeded weights drawn FP8 as a checkpoint stores them; the bytes count them at one byte and
their block scales).

``--smoke`` runs the same code on the tiny CPU deployment in seconds. Writes
``<out>/<platform>/prefill_forms.json`` (``prefill_forms-fp8.json`` with ``--ffn-weights fp8``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import yaml

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_bench import decode_step as rank_side  # noqa: E402
from splash_bench import expanded_warm_up  # noqa: E402
from splash_bench.platform_name import device_memory_fraction  # noqa: E402
from splash_bench.run_roofline import (ModelCosts, deployment_costs, physical_limit, schedule,  # noqa: E402
                                       schedule_difference)
from splash_core import dtypes, results  # noqa: E402
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
    p.add_argument("--ffn-weights", choices=("compute", "fp8"), default="compute",
                   help="feed-forward weights in the compute format or kept FP8 (block-scaled e4m3)")
    p.add_argument("--copy-mib", type=int, default=2048, help="bytes copied to measure the copy bandwidth")
    p.add_argument("--matmul-n", type=int, default=8192, help="square matmul size for the matmul rate")
    p.add_argument("--smoke", action="store_true", help="cpu-tiny deployment, rollout-tiny: checks the script")
    args = p.parse_args(argv)
    if args.T != 1:  # run_roofline counts one device's steps
        p.error(f"--T {args.T}: the run's physical limit is counted at T = 1")
    if args.smoke:
        args.deployment, args.workload, args.T, args.layers = "cpu-tiny", "rollout-tiny", 1, None
        args.copy_mib, args.matmul_n = 8, 128
    return args


def deployment(args, form: str) -> dict:
    data = yaml.safe_load(Path(find("deployment", args.deployment)).read_text())
    data.update(name=f"{data['name']}-{form}", T=args.T, prefill_attention=form, ffn_weights=args.ffn_weights)
    if args.layers is not None:
        data["layers"] = args.layers
    if not args.smoke:  # its hardware profile is an H200's: plan no more memory than this GPU has
        hardware = load("hardware", data["hardware"])
        fraction = data.get("memory_fraction", 0.9)
        data["memory_fraction"] = device_memory_fraction(fraction, hardware.memory_bytes / 2**30)
    if args.smoke and args.ffn_weights == "fp8":  # cpu-tiny's checkpoint is not FP8: its seeded widths are
        data["model"] = "tiny-mla"
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


def warm_up_expanded(pool, args, probe: dict, forms: list[str]) -> dict | None:
    """:func:`~splash_bench.expanded_warm_up.warm_expanded` on every rank for the workload's longest
    request (None: no form attends expanded)."""
    if forms == ["absorbed"]:
        return None
    longest = max(r.prompt_tokens + r.max_new_tokens for r in load("workload", args.workload).requests())
    warmed = pool.run(expanded_warm_up.warm_expanded, probe, args.prefill_chunk, longest)[0]
    print(f"expanded provider warm-up: {warmed}", flush=True)
    return warmed


def sample(form: str, summary, overlap: bool) -> dict:
    prefill = [ms for ms, rows, reqs in zip(summary.step_ms, summary.step_rows, summary.step_requests) if rows > reqs]
    decode = [ms for ms, rows, reqs in zip(summary.step_ms, summary.step_rows, summary.step_requests) if rows == reqs]
    return {"form": form if overlap else f"{form}/no-overlap", "overlap": overlap, "booked": summary.booked,
            "tokens_per_s": summary.tokens_per_s, "elapsed_s": summary.elapsed_s,
            "steps": summary.steps, "prompt_tokens": summary.prompt_tokens, "output_tokens": summary.output_tokens,
            "prefill_steps": len(prefill), "prefill_s": sum(prefill) / 1e3,
            "prefill_step_p50_ms": statistics.median(prefill) if prefill else 0.0,
            "decode_step_p50_ms": statistics.median(decode) if decode else 0.0,
            "step_ms": list(summary.step_ms), "step_device_ms": list(summary.step_device_ms),
            "step_rows": list(summary.step_rows), "step_requests": list(summary.step_requests)}


def with_limit(got: dict, served, form: str, costs: ModelCosts, requests, rates: dict) -> dict:
    """``got`` (:func:`sample`) with its run's physical limit (:mod:`splash_bench.run_roofline`)."""
    steps = schedule(requests, served.prefill_chunk)
    differs = schedule_difference(steps, served.step_rows, served.step_requests)
    ran_decode = [rows == reqs for rows, reqs in zip(served.step_rows, served.step_requests)]
    limit = physical_limit(costs, steps, form, rates, served.step_ms, served.elapsed_s, served.step_device_ms,
                           ran_decode)
    return {**got, **limit, "schedule_matches": not differs, "schedule_difference": differs}


def _limit_line(s: dict) -> str:
    prefill, decode = s["parts"]["prefill"], s["parts"]["decode"]
    estimated = "" if s["schedule_matches"] else f" (schedule estimated: {s['schedule_difference']})"
    device = ("" if prefill["device_s"] is None else
              f"; device time: prefill {prefill['device_s']:.1f} s, decode {decode['device_s']:.1f} s")
    return (f"{s['form']:>9}: physical limit {s['physical_limit_s']:.1f} s of {s['measured_s']:.1f} s measured "
            f"({s['ratio']:.0%}; prefill {prefill['limit_s']:.1f} of {prefill['measured_s']:.1f} s, decode "
            f"{decode['limit_s']:.1f} of {decode['measured_s']:.1f} s{device}){estimated}")


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.time()
    forms = [f for f in args.forms.split(",") if f]
    probe = deployment(args, forms[0])
    with RankPool(args.T, backend=probe.get("backend", "auto"), timeout_s=900) as pool:
        warmed = warm_up_expanded(pool, args, probe, forms)
        for form in forms:  # untimed, a few requests of the rollout's lengths: compiles each form's kernels
            run(pool, args, form, warm_up=True)
        runs = []
        for form, overlap in [(f, o == "on") for f in forms for o in args.overlap.split(",")]:
            served = run(pool, args, form, overlap=overlap)
            got = sample(form, served, overlap)
            print(f"{got['form']:>9}: {got['tokens_per_s']:,.0f} tokens/s, {got['prefill_steps']} prefill steps "
                  f"{got['prefill_s']:.1f} s (p50 {got['prefill_step_p50_ms']:.0f} ms), decode p50 "
                  f"{got['decode_step_p50_ms']:.1f} ms", flush=True)
            runs.append((form, served, got))
        dep = load("deployment", probe)
        # after the runs, so the runs plan their memory as before; the same process, the same device
        rates = pool.run(rank_side.device_rates, args.copy_mib, args.matmul_n, dtypes.torch_dtype(dep.compute_dtype),
                         fp8=dep.ffn_weights == "fp8")[0]
    costs = deployment_costs(dep)
    requests = [(r.prompt_tokens, r.max_new_tokens) for r in load("workload", args.workload).requests()]
    samples = [with_limit(got, served, form, costs, requests, rates) for form, served, got in runs]
    for s in samples:
        print(_limit_line(s), flush=True)
    platform = args.platform or dep.hardware.platform
    base = samples[0]["tokens_per_s"]
    summary = {"tokens_per_s": {s["form"]: s["tokens_per_s"] for s in samples},
               "over_first": {s["form"]: s["tokens_per_s"] / base if base else 0.0 for s in samples},
               "rates": rates, "ffn_weights": args.ffn_weights, "expanded_warm_up": warmed,
               "physical_limit": {s["form"]: {k: s[k] for k in ("physical_limit_s", "measured_s", "ratio")}
                                  for s in samples}}
    data = results.make_result(
        benchmark="prefill_forms", platform=platform, backend=served.backend, model=dep.model.name, T=args.T,
        dtype=dep.compute_dtype, samples=samples, summary=summary,
        notes=(f"workload {args.workload}, policy {args.policy}, {dep.layers or dep.model.num_layers} layers, "
               f"seeded weights; each form first served 4 requests untimed (kernel compilation), after the expanded "
               f"provider's warm-up where it has one (summary.expanded_warm_up: every shape bucket's graph); "
               f"a prefill step is one with more rows than requests; feed-forward weights {args.ffn_weights}; "
               f"physical limit (issue 39): prefill steps' matmul FLOPs (every row through the layers' 2-D weights, "
               f"routed experts at top-k of them, the LM head per request, attention by the form each request "
               f"attends in with kv_b's work) at the measured matmul rate (those through FP8-kept weights at the "
               f"measured FP8 rate, rates.fp8_matmul_tflops, where there is one), decode steps' bytes (every weight but "
               f"the embedding once, FP8 ones at 1 byte + scales, and every request's KV history) or FLOPs, the "
               f"longer, at the measured copy / matmul rate; the steps' contexts from replaying the controller's "
               f"batches, checked against the run's rows and requests per step (schedule_matches); measured_s = "
               f"the run's elapsed time; ratio = limit / measured"))
    name = "prefill_forms" + ("-fp8" if args.ffn_weights == "fp8" else "")
    print("wrote", results.write_result(data, args.out, name=name), f"({time.time() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
