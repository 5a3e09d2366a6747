#!/usr/bin/env python
"""Does the cost model predict the runtime that exists? The predicted step times against the
measured ones of ``bench/runtime_step.py`` (one decode and one prefill step per layout and
context, DeepSeek-V3 attention dims).

The host term of the hardware profile (h_ℓ per layout, :mod:`splash_core.host_overhead`) is
fitted to the decode points at ``--fit-context`` only (one per layout); every other point —
decode at the other contexts and every prefill — is a prediction it never saw. t0 and the
rest of θ are the hardware profile's. η_h (how much host time hides behind device time) is
not identifiable from one context per layout, so each variant fixes it:

- ``Eq 10 alone``: the profile without a host term (what the scheduler used before);
- ``host added (η_h = 0)``: host and device time add (the host backend's behaviour);
- ``host hidden (η_h = 1)``: a layer takes the longer of the two (an accelerator whose host
  queues work ahead of the device);
- ``calibrated η_h``: the profile's own ``host_overlap``, when ``splash calibrate`` measured one;
- ``calibrated profile as is``: the profile's own host term, fitted by ``splash calibrate`` to a
  few layers of the same runtime, with nothing fitted here (meaningful when the runtime steps
  were measured with the runtime version that was calibrated).

Per variant: the mean and largest absolute error on the held-out decode and prefill points,
and at each held-out (phase, context) how much slower the layout the model picks measured than
the measured fastest (the regret of trusting the model). Writes
``<out>/<platform>/costmodel_check.json`` (source ``model``) and prints a table. Nothing here
is tuned by hand: the only numbers fitted here are the four h_ℓ per variant, from the fit
points alone.

    python bench/costmodel_check.py            # bench/results/h200/runtime_step.json, profile h200
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_core import host_overhead, results  # noqa: E402
from splash_core.costmodel import CostModel  # noqa: E402
from splash_core.layouts import LAYOUTS, Layout  # noqa: E402
from splash_core.profiles.deployment import SchedulerConfig  # noqa: E402
from splash_core.profiles.loader import load  # noqa: E402

PAGE_SIZE = 64  # bench/runtime_step.py's default, which the committed measurements used


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measured", default="bench/results/h200/runtime_step.json", help="a runtime_step result")
    p.add_argument("--hardware", default=None, help="hardware profile (default: the measured file's platform)")
    p.add_argument("--fit-context", type=int, default=8192, help="decode context the host term is fitted at")
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    return p.parse_args(argv)


def measured_points(result) -> tuple[list[dict], int]:
    """The summary's median points and the layer count every sample ran with."""
    layers = {s["layers"] for s in result["samples"] if "layers" in s}
    if len(layers) != 1:
        raise SystemExit(f"{result.path}: expected one layer count over all samples (got {sorted(layers)})")
    return result["summary"]["points"], layers.pop()


AS_CALIBRATED = "calibrated profile as is"


def variants(hardware) -> list[tuple[str, float | None]]:
    """(name, η_h) per variant; None: no host term fitted here (Eq 10 alone, or the profile's own)."""
    out = [("Eq 10 alone", None), ("host added (η_h = 0)", 0.0), ("host hidden (η_h = 1)", 1.0)]
    if hardware.host_overlap is not None and hardware.host_overlap.source == "measured":
        out.append((f"calibrated η_h = {hardware.host_overlap.value:g}", hardware.host_overlap.value))
        out.append((AS_CALIBRATED, None))
    return out


def predict(cost: CostModel, point: dict) -> float:
    """Eq 10 (with whatever host term ``cost`` carries) for one measured configuration, seconds."""
    rows = point["rows"] // point["batch"]
    x = host_overhead.uniform_batch(point["batch"], point["context"], cost.T, query_rows=rows)
    return float(cost.evaluate(x).total_s[LAYOUTS.index(Layout(point["layout"]))])


def check(result, hardware, fit_context: int) -> dict:
    data = result.data
    # what the measured runtime ran: a dense MLP in every layer (it had no experts then), dense attention
    model, T, dtype = dataclasses.replace(load("model", data["model"]), moe=None), data["T"], data["dtype"]
    points, layers = measured_points(result)
    fit = [p for p in points if p["phase"] == "decode" and p["context"] == fit_context]
    if sorted(p["layout"] for p in fit) != sorted(str(l) for l in LAYOUTS):
        raise SystemExit(f"{result.path}: no decode point at {fit_context} tokens for every layout")

    def cost_model(hw) -> CostModel:
        return CostModel(model, hw, T, page_size=PAGE_SIZE, compute_dtype=dtype,
                         overlap=SchedulerConfig().overlap, layers=range(layers), sparse=False)

    device = cost_model(hardware.without_host_overheads())
    t0 = device.overhead
    layer_points = [host_overhead.layer_point(device, Layout(p["layout"]), layers, p["batch"], p["context"],
                                              p["median_ms"] / 1e3, t0) for p in fit]
    rows, summaries, overheads = [], [], []
    for name, eta in variants(hardware):
        if name == AS_CALIBRATED:  # h_ℓ from `splash calibrate`'s few-layer steps: nothing fitted here
            cost = cost_model(hardware)
            overheads += [{"variant": name, "layout": str(l), "layer_overhead_us": hardware.layer_overhead_s(l) * 1e6}
                          for l in LAYOUTS]
        elif eta is None:
            cost = device
        else:
            host = host_overhead.fit_host_overheads(layer_points, host_overlap=eta)
            hw = hardware.with_host_overheads(
                {l: h * 1e6 for l, h in host.layer_s.items()}, eta, source="measured",
                ref=f"fitted by bench/costmodel_check.py to the decode points at {fit_context} tokens of {result.path}",
                date=data["date"][:10], machine=data["machine"], command=data["command"])
            cost = cost_model(hw)
            overheads += [{"variant": name, "layout": str(l), "layer_overhead_us": h * 1e6} for l, h in host.layer_s.items()]
        mine = []
        for p in points:
            predicted_ms = predict(cost, p) * 1e3
            role = "fit" if p in fit else "check"  # the same held-out points for every variant
            mine.append({"variant": name, "layout": p["layout"], "phase": p["phase"], "context": p["context"],
                         "role": role, "measured_ms": p["median_ms"], "predicted_ms": predicted_ms,
                         "error_pct": 100.0 * (predicted_ms - p["median_ms"]) / p["median_ms"]})
        rows += mine
        eta_used = hardware.host_overlap_fraction if name == AS_CALIBRATED else eta
        summaries.append(_variant_summary(name, eta_used, [r for r in mine if r["role"] == "check"]))
    return {"measured_file": result.path, "hardware": hardware.name, "layers": layers,
            "fit": f"host term per layout fitted to the decode step at {fit_context} tokens (one point per layout)",
            "step_overhead_us": t0 * 1e6, "variants": summaries, "overheads": overheads, "points": rows}


def _variant_summary(name: str, eta: float | None, held_out: list[dict]) -> dict:
    out = {"variant": name}
    if eta is not None:
        out["host_overlap"] = eta
    for phase in ("decode", "prefill"):
        errors = [abs(r["error_pct"]) for r in held_out if r["phase"] == phase]
        out[f"{phase}_mean_abs_error_pct"] = statistics.fmean(errors)
        out[f"{phase}_max_abs_error_pct"] = max(errors)
    regrets = []  # what running the predicted fastest layout costs over the measured fastest
    for case in sorted({(r["phase"], r["context"]) for r in held_out}):
        group = [r for r in held_out if (r["phase"], r["context"]) == case]
        if len(group) == len(LAYOUTS):
            chosen = min(group, key=lambda r: r["predicted_ms"])["measured_ms"]
            regrets.append(100.0 * (chosen / min(r["measured_ms"] for r in group) - 1.0))
    out.update(cases=len(regrets), mean_regret_pct=statistics.fmean(regrets), max_regret_pct=max(regrets))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    result = results.read_result(args.measured)
    if result.benchmark != "runtime_step":
        raise SystemExit(f"{args.measured}: a runtime_step result is needed (got {result.benchmark})")
    hardware = load("hardware", args.hardware or result.platform)
    summary = check(result, hardware, args.fit_context)
    data = results.make_result(
        benchmark="costmodel_check", platform=result.platform, backend=result.data["backend"],
        model=result.data["model"], T=result.data["T"], dtype=result.data["dtype"], samples=[], summary=summary,
        source="model",
        notes=f"predictions of the cost model (hardware profile {hardware.name}) beside the measured steps of "
              f"{args.measured}; only the host term is fitted, to the fit points alone")
    for v in summary["variants"]:
        eta = "" if "host_overlap" not in v else f" (η_h {v['host_overlap']:g})"
        print(f"{v['variant']:28s}{eta:12s} decode |err| mean {v['decode_mean_abs_error_pct']:6.1f}% "
              f"max {v['decode_max_abs_error_pct']:6.1f}%   prefill |err| mean {v['prefill_mean_abs_error_pct']:6.1f}% "
              f"max {v['prefill_max_abs_error_pct']:6.1f}%   regret of the predicted fastest layout mean "
              f"{v['mean_regret_pct']:5.1f}% max {v['max_regret_pct']:5.1f}% ({v['cases']} cases)")
    print("wrote", results.write_result(data, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
