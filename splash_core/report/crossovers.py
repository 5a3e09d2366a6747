"""Predicted crossovers beside measured ones.

A ``crossovers`` result (paper or cost model) predicts where the fastest layout changes
along one axis with the other coordinate fixed. The measured crossovers come from the
fixed-layout sweeps of the same platform along the same axis at the same fixed coordinate:
between two sampled positions whose best layouts differ. Each prediction is paired with the
next measured change of the same (from, to) and marked inside or outside that interval;
measured changes no prediction accounts for are listed too.
"""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import MISSING, table
from .sweep_data import Sweep, sweeps


def matching_sweeps(result: Result, ctx: Context) -> list[tuple[Result, Sweep]]:
    """The sweeps that test this prediction: same platform, model and T, along the same axis
    at the same fixed coordinate; the paper's predictions meet the paper's sweeps, the cost
    model's meet our measurements, so paper and measured numbers never share a comparison."""
    summary = result["summary"]
    axis = summary["axis"]
    fixed = summary["batch"] if axis == "input_tokens" else summary["input_tokens"]
    wanted_source = "paper" if result.data["source"] == "paper" else "measured"
    return [(r, s) for r in ctx.results
            if r.benchmark == "fixed_layout_sweep" and r.data["source"] == wanted_source
            and (r.data["model"], r.data["T"]) == (result.data["model"], result.data["T"])
            for s in sweeps(r) if s.axis == axis and s.fixed == fixed]


def _source_name(result: Result) -> str:
    d = result.data
    return f"paper {d['reference'].split(',')[0]}" if d["source"] == "paper" else f"{d['source']} {d['platform']}"


def render(result: Result, ctx: Context) -> list[str]:
    """One row per predicted change with the measured interval it falls in, or not; then the
    measured changes no prediction accounts for."""
    summary = result["summary"]
    axis = summary["axis"]
    fixed_key = "batch" if axis == "input_tokens" else "input_tokens"
    measured = matching_sweeps(result, ctx)
    lines = [f"Along {axis.replace('_', ' ')} at {fixed_key.replace('_', ' ')} = {summary[fixed_key]:,}"
             + (f" ({summary['scenario']})" if summary.get("scenario") else "") + "."]
    if not measured:
        lines += ["", f"No fixed-layout sweep of this platform runs along {axis.replace('_', ' ')} at "
                  f"{fixed_key.replace('_', ' ')} = {summary[fixed_key]:,}, so nothing measured to compare."]
    headers = ["change", f"predicted at ({_label(result)})"]
    for r, s in measured:
        headers += [f"measured between ({_source_name(r)}: {s.label})", "inside?"]
    claimed: list[set[int]] = [set() for _ in measured]
    rows = [_prediction_row(p, axis, measured, claimed) for p in sorted(summary["predicted"], key=lambda p: p["at"])]
    rows += _unclaimed_rows(measured, claimed)
    return lines + [""] + table(headers, rows, "l" + "r" * (len(headers) - 1)) + [""]


def _prediction_row(p: dict, axis: str, measured: list, claimed: list[set[int]]) -> list[str]:
    """A predicted change, then per measured sweep the next unclaimed change of the same layouts."""
    at = f"{p['at']:,.0f}" + (f" ({p['at'] / 1024:.1f}K)" if axis == "input_tokens" else "")
    row = [f"{p['from']} → {p['to']}", at]
    for k, (_, s) in enumerate(measured):
        match = _next_change(s.leader_changes(), p["from"], p["to"], claimed[k])
        if match is None:
            row += ["not observed", MISSING]
        else:
            lo, hi = match
            row += [f"{lo:,} – {hi:,}", "yes" if lo <= p["at"] <= hi else "no"]
    return row


def _unclaimed_rows(measured: list, claimed: list[set[int]]) -> list[list[str]]:
    """Measured changes no prediction accounts for."""
    rows = []
    for k, (_, s) in enumerate(measured):
        for i, (a, b, lo, hi) in enumerate(s.leader_changes()):
            if i not in claimed[k]:
                cells = [MISSING] * (2 * len(measured))
                cells[2 * k] = f"{lo:,} – {hi:,}"
                rows.append([f"{a} → {b}", "not predicted", *cells])
    return rows


def _label(result: Result) -> str:
    d = result.data
    return f"paper {d['reference']}" if d["source"] == "paper" else "cost model"


def _next_change(changes, src: str, dst: str, claimed: set[int]) -> tuple[int, int] | None:
    for i, (a, b, lo, hi) in enumerate(changes):
        if i not in claimed and (a, b) == (src, dst):
            claimed.add(i)
            return lo, hi
    return None
