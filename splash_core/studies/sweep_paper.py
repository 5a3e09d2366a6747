"""The paper's fixed-layout sweeps (Tables 4, 5, 6) as positions to predict, and the agreement
of a prediction with them: per position, whether the best layout is the paper's, and each
layout's throughput error.

The tables live in ``bench/reference/fixed_layout_sweeps.csv`` (copied from the paper); a
deployment meets the table of its platform (the hardware profile's ``platform``) and model
(names compared case-insensitively), e.g. ``h200-x8-deepseek-v3.2`` meets Table 6.
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path

from ..layouts import LAYOUTS, Layout

TABLES = {"b200": "Table 4", "dcu": "Table 5", "h200": "Table 6"}


@dataclasses.dataclass(frozen=True)
class PaperPosition:
    sweep: str  # the paper's panel label, e.g. "Input-length sweep, B = 16"
    batch: int
    input_tokens: int
    tokens_per_s: dict  # Layout -> the paper's total throughput, tokens/s

    @property
    def best(self) -> Layout:
        """The paper's best layout (ties: first of LAYOUTS, as the report marks them)."""
        return max(LAYOUTS, key=lambda l: (self.tokens_per_s[l], -LAYOUTS.index(l)))


def paper_positions(reference: str | Path, platform: str, model: str) -> list[PaperPosition]:
    """The positions of the paper's table for ``platform`` and ``model``, in table order
    ([] when the paper has none). FileNotFoundError names a missing CSV."""
    path = Path(reference) / "fixed_layout_sweeps.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the paper's fixed-layout sweeps are missing")
    out = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            plat, _, name = row["platform"].partition("/")
            if _platform_family(plat) == _platform_family(platform) and name.lower() == model.lower():
                # the paper prints 10^3 tokens/s
                values = {l: float(row[l.value]) * 1000 for l in LAYOUTS}
                out.append(PaperPosition(row["sweep"], int(row["batch"]), int(row["input_tokens"]), values))
    return out


def _platform_family(name: str) -> str:
    """'DCU-BW1000' and 'dcu' both -> 'dcu'; 'H200' -> 'h200'."""
    return name.lower().split("-")[0]


@dataclasses.dataclass(frozen=True)
class Agreement:
    """A prediction against the paper over some positions."""

    positions: int
    agreeing: int
    errors: tuple[float, ...]  # (predicted − paper) / paper, every layout of every position

    @property
    def fraction(self) -> float:
        return self.agreeing / self.positions if self.positions else 0.0

    @property
    def within_25(self) -> float:
        return sum(abs(e) <= 0.25 for e in self.errors) / len(self.errors) if self.errors else 0.0

    def summary(self) -> dict:
        abs_err = [abs(e) for e in self.errors]
        return {"positions": self.positions, "agreeing": self.agreeing, "fraction": self.fraction,
                "median_abs_error": statistics.median(abs_err) if abs_err else None,
                "mean_abs_error": statistics.fmean(abs_err) if abs_err else None,
                "max_abs_error": max(abs_err, default=None), "within_25_pct": self.within_25}


def agreement(pairs) -> Agreement:
    """``pairs``: (PaperPosition, {Layout: predicted tokens/s or None}, predicted best)."""
    agreeing, errors, n = 0, [], 0
    for paper, predicted, best in pairs:
        n += 1
        agreeing += best is paper.best
        errors += [(predicted[l] - paper.tokens_per_s[l]) / paper.tokens_per_s[l]
                   for l in LAYOUTS if predicted.get(l) is not None]
    return Agreement(n, agreeing, tuple(errors))
