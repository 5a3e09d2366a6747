#!/usr/bin/env python
"""The T = 8 projection of issue 9 while no 8-GPU machine is lent: the paper's H200 group
(DeepSeek-V3.2 on eight H200s) serving a rollout under SPLASH and under each fixed layout,
modelled by ``splash simulate`` (cost model Eq 10 with a hardware profile's θ, switches costed
from the planner's manifests by Eq 7). Nothing here is measured at T = 8::

    python bench/project_t8.py                      # writes bench/results/h200x8/rollout_serving-model-*.json

One result per θ, so the report shows how much of the projection rests on which numbers:

- ``calibrated``: the platform's measured profile (profiles/hardware/h200.yaml: device rates
  and this runtime's host time per layer, both measured on the lent H200 pair);
- ``device-only``: the same device rates with the host term dropped (what the kernels and
  collectives alone would allow; the runtime's host overhead is the gap to ``calibrated``);
- ``paper``: the deployment's paper-derived profile (profiles/hardware/h200-paper.yaml: θ from
  the paper's tables, the device rates fitted to its Table 6 by bench/fit_sweep_theta.py).

The B200 rollout (``--deployment b200-x8-glm-5.3 --workload rollout-b200 --variants paper``)
has only the paper's θ: no B200 was lent.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_core import results  # noqa: E402
from splash_core.layouts import LAYOUTS  # noqa: E402
from splash_core.profiles import load  # noqa: E402
from splash_core.studies.simulator import ORACLE, SPLASH, simulate  # noqa: E402

VARIANTS = ("calibrated", "device-only", "paper")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployment", default="h200-x8-deepseek-v3.2")
    p.add_argument("--workload", default="rollout-h200")
    p.add_argument("--prefill-chunk", type=int, default=8192)
    p.add_argument("--out", default="bench/results", help="results root; files go to <out>/<platform>x<T>/")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {', '.join(VARIANTS)}")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    return args


def deployment_for(name: str, variant: str):
    """The deployment with the hardware θ of ``variant``, and a line saying what that θ is."""
    dep = load("deployment", name)
    if variant == "paper":
        return dep, f"hardware profile {dep.hardware.name} (θ from the paper's tables)"
    hw = load("hardware", dep.hardware.platform)  # the platform's measured profile
    if variant == "device-only":
        hw = hw.with_host_overheads({layout: 0.0 for layout in LAYOUTS}, 1.0, source="assumed",
                                    ref="host term dropped for the device-only projection (bench/project_t8.py)")
        what = f"hardware profile {dep.hardware.platform}'s device rates with no host time per layer"
    else:
        what = f"hardware profile {hw.name} as shipped (device rates and host time per layer measured)"
    return dataclasses.replace(dep, hardware=hw), what


def result_of(args, variant: str) -> dict:
    dep, what = deployment_for(args.deployment, variant)
    workload = load("workload", args.workload)
    sim = simulate(dep, workload, prefill_chunk=args.prefill_chunk)
    specs = {s.id: s for s in workload.requests()}
    best = sim.best_fixed
    rows = []
    for r in sim.results:
        rows.append({"policy": r.policy, "tokens_per_s": r.throughput, "elapsed_s": r.total_time_s, "steps": r.steps,
                     "switches": len(r.switches), "served": len(specs) - len(r.rejected),
                     "layout_steps": ", ".join(f"{k} {v}" for k, v in r.layout_steps.items())
                     + (f"; {r.switch_time_s * 1e3:.1f} ms switching" if r.switches else "")})
    splash = sim.result(SPLASH)
    output_tokens = sum(s.max_new_tokens for i, s in specs.items() if i not in set(splash.rejected))
    switches = "; ".join(f"step {s.step}: {s.src}→{s.dst}, {s.fetched_bytes / 2**30:.1f} GiB, exposed "
                         f"{s.exposed_s * 1e3:.2f} ms (blocking {s.blocking_s * 1e3:.1f} ms)" for s in splash.switches)
    oracle = sim.ratio(ORACLE)
    return results.make_result(
        benchmark="rollout_serving", platform=f"{dep.hardware.platform}x{dep.T}", backend="model",
        model=dep.model.name, T=dep.T, dtype=dep.compute_dtype, source="model",
        machine=f"none: modelled for {dep.T}x {dep.hardware.name}",
        samples=[{**r.summary(), "tokens_per_s": r.throughput} for r in sim.results],
        summary={"workload": workload.name, "output_tokens": output_tokens, "best_fixed": best.policy,
                 "splash_over_best_fixed": sim.splash_ratio, "policies": rows},
        extra={"variant": variant, "theta": what},
        notes=f"projection ({variant}): {what}; {sim.note}; prefill chunk {args.prefill_chunk}; "
              f"the per-step oracle (every step in its fastest layout, switching free) reaches {oracle:.3f}x the "
              f"best fixed layout; SPLASH spent {splash.switch_time_s * 1e3:.1f} ms switching: {switches or 'none'}")


def main(argv=None) -> int:
    args = parse_args(argv)
    for variant in args.variants:
        data = result_of(args, variant)
        s = data["summary"]
        name = f"rollout_serving-model-{variant}" + ("" if args.workload == "rollout-h200" else f"-{args.workload}")
        path = results.write_result(data, args.out, name=name)
        fixed = ", ".join(f"{r['policy']} {r['tokens_per_s']:,.0f}" for r in s["policies"] if r["policy"] != SPLASH)
        print(f"{variant:12s} SPLASH / best fixed ({s['best_fixed']}) {s['splash_over_best_fixed']:.3f}x  "
              f"[tokens/s: {fixed}]  -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
