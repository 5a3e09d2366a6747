#!/usr/bin/env python
"""Fit a paper-derived hardware profile's effective rates to the paper's fixed-layout table.

The paper gives no kernel rates for its deployments, only datasheets and end-to-end sweeps
(Tables 4-6). This fits a few physically meaningful θ of the deployment's hardware profile —
the rate its matrix multiplies reach, the rate its attention kernels reach, the HBM rate its
weight and KV reads reach, the fixed time of one engine step, and the rates DOP's activation
all-to-all and the all-reduce reach — to every throughput of the table at once (4 layouts x
every position), by least squares on log throughput. Nothing is fitted per position or per
layout, and the winner of a position is not part of the objective: the agreement and regret
`splash sweep --paper` reports are outcomes, not targets.

Held out (``--held-out``): the same fit on the input-length sweeps alone, scored on the
batch-size sweeps, and the reverse, beside the fit on everything; a fit that memorises
positions shows as held-out scores worse than in-sample ones. ``--out`` writes every fit's
rates and scores as a ``sweep_theta_fit`` result (source ``model``).

Search: coordinate descent in log space (each rate multiplied and divided by a step that
shrinks 2 -> 1.05), each rate kept within [lower, upper] (upper: the datasheet peak or the
NVLink line rate). With ``--write`` the fitted values replace the profile's, each with
source ``paper`` and a ref naming the table, this command and the objective reached.

    python bench/fit_sweep_theta.py --deployment h200-x8-deepseek-v3.2 --write --held-out --out bench/results
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import re
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from splash_core import results  # noqa: E402
from splash_core.profiles import load  # noqa: E402
from splash_core.profiles.loader import find  # noqa: E402
from splash_core.profiles.quantity import Quantity  # noqa: E402
from splash_core.studies.sweep import predict  # noqa: E402
from splash_core.studies.sweep_paper import TABLES, paper_positions, regret  # noqa: E402

RATES = ("matmul_tflops", "attention_tflops", "hbm_gbps", "step_overhead_us", "all_to_all_gbps", "all_reduce_gbps")
SUBSETS = {"all": lambda p: True, "input": lambda p: p.sweep.startswith("Input-length"),
           "batch": lambda p: p.sweep.startswith("Batch-size")}
MISSING_PENALTY = math.log(10.0) ** 2  # a layout predicted not to fit where the paper ran it


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployment", required=True)
    p.add_argument("--mode", default="disaggregated")
    p.add_argument("--reference", default="bench/reference")
    p.add_argument("--rounds", type=int, default=4, help="step sizes tried (2, 1.41, 1.19, 1.09[, 1.04])")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--write", action="store_true", help="write the fitted rates into the hardware profile")
    p.add_argument("--held-out", action="store_true",
                   help="also fit on the input-length sweeps alone and on the batch-size sweeps alone, each "
                        "scored on the other")
    p.add_argument("--out", metavar="DIR", help="write the fits and their scores as a sweep_theta_fit result")
    p.add_argument("--resume", metavar="LOG", help="continue each fit from the last rates and step size it printed "
                                                   "to LOG (the output of an interrupted run of this command)")
    return p.parse_args(argv)


def peak(q: Quantity) -> float:
    """A datasheet value; four times an assumed placeholder (no datasheet: the fit may find
    the device faster than guessed); or the peak an earlier fit recorded in its ref ("peak N")."""
    if q.source == "datasheet":
        return q.value
    if q.source == "assumed":
        return 4 * q.value
    found = re.search(r"peak ([0-9.]+)", q.ref)
    if not found:
        raise SystemExit(f"no peak for {q!r}: the fit needs one to bound the rate")
    return float(found[1])


def start_and_bounds(hw) -> dict[str, tuple[float, float, float]]:
    """(start, lower, upper) per fitted rate: datasheet peaks bound the device rates; the link's
    line rate bounds the exchange (the profiles take all-reduce at 80% of it)."""
    peak_flops, peak_hbm = peak(hw.matmul_tflops), peak(hw.weight_read_gbps)
    link = max(hw.all_gather_gbps.value, hw.all_reduce_gbps.value) / 0.8
    return {"matmul_tflops": (0.5 * peak_flops, 0.02 * peak_flops, peak_flops),
            "attention_tflops": (0.3 * peak_flops, 0.02 * peak_flops, peak_flops),
            "hbm_gbps": (0.6 * peak_hbm, 0.05 * peak_hbm, peak_hbm),
            "step_overhead_us": (10000.0, 10.0, 200000.0),
            "all_to_all_gbps": (0.5 * link, 5.0, link),
            "all_reduce_gbps": (0.5 * link, 5.0, link)}


def with_rates(hw, rates: dict[str, float], ref: str):
    def q(value):
        return Quantity(value=float(value), source="paper", ref=ref)

    return dataclasses.replace(hw, matmul_tflops=q(rates["matmul_tflops"]), attention_tflops=q(rates["attention_tflops"]),
                               weight_read_gbps=q(rates["hbm_gbps"]), kv_read_gbps=q(rates["hbm_gbps"]),
                               step_overhead_us=q(rates["step_overhead_us"]), all_to_all_gbps=q(rates["all_to_all_gbps"]),
                               all_reduce_gbps=q(rates["all_reduce_gbps"]))


_BASE = None  # the deployment being fitted: forked workers inherit it (profiles do not pickle)


def _one(job):
    rates, mode, batch, tokens = job
    dep = dataclasses.replace(_BASE, hardware=with_rates(_BASE.hardware, rates, "fit"))
    return [(lp.layout, lp.tokens_per_s) for lp in predict(dep, batch, tokens, mode=mode).layouts]


def _predictions(pool, rates, mode: str, positions) -> list[dict]:
    """Per position, {layout: predicted tokens/s or None}."""
    return [dict(pp) for pp in pool.map(_one, [(rates, mode, p.batch, p.input_tokens) for p in positions])]


def _squared_log_errors(positions, predictions) -> list[float]:
    return [MISSING_PENALTY if v is None else math.log(v / paper.tokens_per_s[layout]) ** 2
            for paper, predicted in zip(positions, predictions) for layout, v in predicted.items()]


class Objective:
    def __init__(self, deployment, positions, mode: str, pool):
        self.deployment, self.positions, self.mode, self.pool = deployment, positions, mode, pool
        self.calls = 0

    def __call__(self, rates: dict[str, float]) -> float:
        self.calls += 1
        err = _squared_log_errors(self.positions, _predictions(self.pool, rates, self.mode, self.positions))
        return sum(err) / len(err)


def scores(pool, rates, mode: str, positions) -> dict:
    """How rates meet ``positions``: rms log error, median |throughput error| and the regret of
    the predicted best layouts, scored by the paper's throughputs."""
    predictions = _predictions(pool, rates, mode, positions)
    errors = [abs(v / paper.tokens_per_s[l] - 1) for paper, pr in zip(positions, predictions)
              for l, v in pr.items() if v is not None]
    picks = [(paper, max((l for l in pr if pr[l] is not None), key=pr.get, default=None))
             for paper, pr in zip(positions, predictions)]
    return {"positions": len(positions),
            "rms_log_error": math.sqrt(statistics.fmean(_squared_log_errors(positions, predictions))),
            "median_abs_error": statistics.median(errors), "regret": regret(picks).summary()}


def resumed(log: str | None, label: str) -> tuple[dict[str, float] | None, float]:
    """The last rates and step size ``label``'s fit printed to ``log`` (None, 2: start afresh)."""
    found = re.findall(rf"^{label} (?:start|step ([0-9.]+)) (.*?)  rms log error", Path(log).read_text(), re.M) if log else []
    if not found:
        return None, 2.0
    steps = [float(step) for step, _ in found if step]  # a resumed run's start line repeats the last step's rates
    return {k: float(v) for k, v in (pair.split("=") for pair in found[-1][1].split())}, steps[-1] if steps else 2.0


def fit(objective: Objective, bounds, rounds: int, label: str = "", resume: str | None = None
        ) -> tuple[dict[str, float], float]:
    start, first = resumed(resume, label)
    rates = start or {k: v[0] for k, v in bounds.items()}
    best = objective(rates)
    print(f"{label} start {fmt(rates)}  rms log error {math.sqrt(best):.3f}", flush=True)
    for step in [2 ** (1 / 2 ** i) for i in range(rounds) if 2 ** (1 / 2 ** i) <= first * 1.0001]:
        improved = True
        while improved:
            improved = False
            for key in RATES:
                for factor in (step, 1 / step):
                    trial = dict(rates)
                    lo, hi = bounds[key][1:]
                    trial[key] = min(hi, max(lo, rates[key] * factor))
                    if trial[key] == rates[key]:
                        continue
                    value = objective(trial)
                    if value < best - 1e-6:
                        rates, best, improved = trial, value, True
                        print(f"{label} step {step:.3f} {fmt(rates)}  rms log error {math.sqrt(best):.3f}", flush=True)
                        break
    return rates, best


def fmt(rates) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in rates.items())


def _origin(q: Quantity) -> str:
    """Where the bound came from, kept across re-fits."""
    if q.source in ("datasheet", "assumed"):
        return f"{q.source}: {q.ref}"
    found = re.search(r"peak [0-9.]+ \((.*)\)$", q.ref)
    return found[1] if found else q.ref


def write_profile(hw, rates: dict[str, float], ref: str) -> Path:
    """Replace the fitted keys' lines of the hardware profile's YAML, keeping everything else."""
    path = find("hardware", hw.name)
    text = path.read_text()
    previous = {k: getattr(hw, k) for k in ("matmul_tflops", "weight_read_gbps")}
    lines = {
        "matmul_tflops": (rates["matmul_tflops"], f"{ref}; peak {peak(previous['matmul_tflops']):g} "
                                                  f"({_origin(previous['matmul_tflops'])})"),
        "attention_tflops": (rates["attention_tflops"], ref),
        "weight_read_gbps": (rates["hbm_gbps"], f"{ref}; peak {peak(previous['weight_read_gbps']):g} "
                                                f"({_origin(previous['weight_read_gbps'])})"),
        "kv_read_gbps": (rates["hbm_gbps"], f"{ref} (the same HBM rate as weight reads)"),
        "step_overhead_us": (rates["step_overhead_us"], ref),
        "all_to_all_gbps": (rates["all_to_all_gbps"], f"{ref}: DOP's activation exchange (switches use switch_transfer)"),
        "all_reduce_gbps": (rates["all_reduce_gbps"], ref),
    }
    for key, (value, why) in lines.items():
        entry = f"{key}: {{value: {float(f'{value:.4g}')!r}, source: paper, ref: \"{why}\"}}"  # YAML reads 2e+04 as text
        pattern = re.compile(rf"^{key}:.*?(?=^\S)", re.M | re.S)
        text, n = pattern.subn(entry + "\n", text, count=1)
        if n == 0:
            text = text.replace("all_gather_gbps:", f"{entry}\nall_gather_gbps:", 1)
    path.write_text(text)
    load("hardware", str(path))  # the written profile must load
    return path


def main(argv=None) -> int:
    args = parse_args(argv)
    deployment = load("deployment", args.deployment)
    hw = deployment.hardware
    positions = paper_positions(args.reference, hw.platform, deployment.model.name)
    if not positions:
        raise SystemExit(f"the paper has no table for {deployment.model.name} on {hw.platform}")
    table = TABLES[hw.platform]
    global _BASE
    _BASE = deployment
    command = " ".join(shlex.quote(a) for a in ["python", "bench/fit_sweep_theta.py", *(argv or sys.argv[1:])])
    def fit_on(subset: str, pool) -> dict:
        on = [p for p in positions if SUBSETS[subset](p)]
        objective = Objective(deployment, on, args.mode, pool)
        rates, best = fit(objective, start_and_bounds(hw), args.rounds, label=subset, resume=args.resume)
        return {"rates": rates, "rms_log_error": math.sqrt(best), "evaluations": objective.calls,
                "scores": {name: scores(pool, rates, args.mode, [p for p in positions if keep(p)])
                           for name, keep in SUBSETS.items()}}

    subsets = ("all", "input", "batch") if args.held_out else ("all",)
    # the fits are independent: each runs in a thread, all share one pool of worker processes
    with multiprocessing.get_context("fork").Pool(args.workers) as pool, ThreadPoolExecutor(len(subsets)) as threads:
        fits = dict(zip(subsets, threads.map(lambda subset: fit_on(subset, pool), subsets)))
    ref = (f"fitted to {table}'s {len(positions) * 4} throughputs ({args.mode} protocol, rms log error "
           f"{fits['all']['rms_log_error']:.3f}) by `{command}`")
    print(f"fitted: {fmt(fits['all']['rates'])}\n{ref}")
    for subset, f in fits.items():
        for name, sc in f["scores"].items():
            held = ("in-sample" if subset in ("all", name) else "held out" if name != "all" else "partly held out")
            r = sc["regret"]
            print(f"fit on {subset:5} scored on {name:5} ({held:15}): rms log error {sc['rms_log_error']:.3f}, median "
                  f"|error| {sc['median_abs_error']:.1%}, picks {r['picks_over_oracle']:.3f}x oracle, "
                  f"{r['picks_over_best_fixed']:.3f}x fixed {r['best_fixed']}, agree {r['strict']}/{r['positions']}")
    if args.write:
        print(f"wrote {write_profile(hw, fits['all']['rates'], ref)}")
    if args.out:
        data = results.make_result(
            benchmark="sweep_theta_fit", platform=f"{hw.platform}x{deployment.T}", backend="cost model",
            model=deployment.model.name, T=deployment.T, dtype=f"{deployment.model.weight_dtype} weights",
            source="model", command=command, machine=f"fitted for {deployment.T}x {hw.name}",
            samples=[{"fit_on": k, **v["rates"]} for k, v in fits.items()],
            summary={"table": table, "mode": args.mode, "fits": fits},
            notes=f"θ fitted to the paper's {table} (deployment {deployment.name}); scores use the paper's throughputs")
        print(f"wrote {results.write_result(data, args.out, name=f'sweep_theta_fit-{deployment.name}')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
