"""Markdown building blocks shared by the report's sections: tables, number formats and the
provenance line that labels every block measured, paper or model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..results import Result

LABELS = {
    "measured": "measured",
    "paper": "paper",
    "model": "model (computed by SPLASH's cost model, not a measurement)",
}
MISSING = "n/a"  # a value the result does not carry


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> list[str]:
    """A GitHub Markdown table; ``align`` has one 'l'/'r' per column (default: first left, rest right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def fixed(value: float | None, digits: int) -> str:
    """``value`` with ``digits`` decimals and thousands separators; ``n/a`` for None."""
    return MISSING if value is None else f"{value:,.{digits}f}"


def rate(value: float | None) -> str:
    """Throughput-like numbers: whole units from 100 up, three significant digits below."""
    if value is None:
        return MISSING
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def sig(value: float | None) -> str:
    """Rates (GB/s, TFLOP/s): one decimal from 100 up, three significant digits below, so a
    CPU's 0.157 TFLOP/s and an H200's 4,012.5 GB/s both read right."""
    if value is None:
        return MISSING
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"


def ms(value: float | None) -> str:
    """Milliseconds: two decimals (the paper's precision for step times and overheads); three
    significant digits for values under 0.1 ms so CPU-scale timings stay readable."""
    if value is None:
        return MISSING
    return f"{value:,.2f}" if value == 0 or abs(value) >= 0.1 else f"{value:.3g}"


def tokens(n: int) -> str:
    """Token counts the way the paper labels axes: 1K = 1,024 when exact, else the number."""
    if n >= 1024 and n % 1024 == 0:
        k = n // 1024
        return f"{k // 1024}M" if k % 1024 == 0 else f"{k}K"
    return f"{n:,}"


def bold(text: str) -> str:
    return f"**{text}**"


def provenance(result: Result) -> str:
    """One line that says where a block's numbers come from; paper blocks cite the table."""
    d = result.data
    if d["source"] == "paper":
        machine = d["machine"].removeprefix("paper: ")
        return f"**paper** — {d['reference']} of the SPLASH paper: {d['model']}, T = {d['T']}, {d['dtype']}; {machine}."
    return (f"{bold(LABELS[d['source']])} — {d['platform']} · {d['machine']} · backend {d['backend']} · "
            f"model {d['model']} · T = {d['T']} · {d['dtype']} · {d['date']} · commit {d['git_commit']} · "
            f"command `{d['command']}` · file `{result.path}`.")


def device(machine: str) -> str:
    """The accelerator (or CPU) part of a machine description: what follows the torch version in
    :func:`splash_core.results.machine_description` ('vm, x86_64, torch 2.11, 2x X' -> '2x X'); a
    description of another form is returned whole (the paper's without its 'paper: ')."""
    parts = [p.strip() for p in machine.split(",")]
    for i, part in enumerate(parts[:-1]):
        if part.startswith("torch "):
            return ", ".join(parts[i + 1:])
    return machine.removeprefix("paper: ")


def source_label(result: Result, detail: bool = False) -> str:
    """Where a result's numbers come from, with the group size T and the machine: 'paper (T = 8)',
    'measured (h200x2: T = 2 on 2x X)', 'measured (h200: T = 1, one device of 2x X)', 'model (cpu:
    T = 2, SPLASH's cost model)'. ``detail`` adds the paper's machine."""
    d = result.data
    if d["source"] == "paper":
        return f"paper (T = {d['T']}; {device(d['machine'])})" if detail else f"paper (T = {d['T']})"
    if d["source"] == "model":
        return f"model ({d['platform']}: T = {d['T']}, SPLASH's cost model)"
    machine = device(d["machine"])
    where = f"T = 1, one device of {machine}" if d["T"] == 1 else f"T = {d['T']} on {machine}"
    return f"{d['source']} ({d['platform']}: {where})"


def block_heading(result: Result, level: int = 4) -> str:
    """The heading of one result's block, e.g. '#### paper: Table 4, Figure 4' or '#### measured:
    h200x2, deepseek-v3, T = 2 (2026-11-29, commit dbe671d)'; the date and commit tell apart
    two runs of one benchmark on one platform, a model result's ``variant`` two projections."""
    d = result.data
    if d["source"] == "paper":
        return f"{'#' * level} paper: {d['reference']}"
    if d["source"] == "measured":
        run = f" ({d['date'][:10]}, commit {d['git_commit'][:7]})"
    else:  # a model result may name which θ it ran on (e.g. bench/project_t8.py's variants)
        run = f" ({d['variant']})" if d.get("variant") else ""
    return f"{'#' * level} {d['source']}: {d['platform']}, {d['model']}, T = {d['T']}{run}"


def block_intro(result: Result, level: int = 4) -> list[str]:
    """A result block's heading (Markdown ``level``), provenance line and notes."""
    lines = [block_heading(result, level), "", provenance(result)]
    if result.data.get("notes"):
        lines += ["", f"*Note:* {result.data['notes']}"]
    return lines + [""]
