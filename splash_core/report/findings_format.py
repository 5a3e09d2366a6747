"""How a finding states its numbers: each item names where they come from (measured here,
taken from the paper, or the cost model's), and ranges read 'low–high (median m)'."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from pathlib import PurePath

from ..results import Result
from .context import block_order
from .markdown import source_label
from .platforms import family, title


def origin(result: Result, file: bool = False) -> str:
    """Where a result's numbers come from, in words a finding starts with: 'measured here (h200x2:
    T = 2 on 2x H200)', 'taken from the paper (B200, Table 7; T = 8)', 'cost model (h200x8: T = 8, paper)';
    ``file`` adds the result's file name, to tell apart results of one benchmark and machine."""
    if file:
        return f"{origin(result)}, `{PurePath(result.path).name}`"
    d = result.data
    if d["source"] == "paper":
        return f"taken from the paper ({title(family(result.platform))}, {d['reference'].split(',')[0]}; T = {d['T']})"
    if d["source"] == "model":
        variant = f", {d['variant']}" if d.get("variant") else ""
        return f"cost model ({result.platform}: T = {d['T']}{variant})"
    return f"{d['source']} here {source_label(result).split(' ', 1)[1]}"


def finding(headline: str, items: list[str]) -> list[str]:
    """A bullet with one sub-bullet per source; nothing when no result gave an item."""
    if not items:
        return []
    return [f"- **{headline}**"] + [f"  - {item}" for item in items]


def span(values: Iterable[float], fmt: Callable[[float], str]) -> str:
    """'low–high (median m)' of ``values``; one value alone as itself."""
    values = sorted(values)
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(values[0])}–{fmt(values[-1])} (median {fmt(statistics.median(values))})"


def times(value: float) -> str:
    return f"{value:.2f}x"


def percent(value: float) -> str:
    """A percentage given in percent (12.5 -> '12.5%')."""
    return f"{value:.1f}%"


def of_type(results: list[Result], benchmark: str, source: str | None = None) -> list[Result]:
    """The results of one benchmark (and source), paper first, then by folder and file."""
    chosen = [r for r in results if r.benchmark == benchmark and (source is None or r.data["source"] == source)]
    return sorted(chosen, key=block_order)
