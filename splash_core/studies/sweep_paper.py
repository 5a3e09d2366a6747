"""The paper's fixed-layout sweeps (Tables 4, 5, 6) as positions to predict, and how a
prediction meets them: its agreement (per position, whether the best layout is the paper's,
and each layout's throughput error) and its regret (the time of running the predicted picks,
scored by the paper's own measured throughputs, against the paper's best at every position
and against never switching).

The tables live in ``bench/reference/fixed_layout_sweeps.csv`` (copied from the paper); a
deployment meets the table of its platform (the hardware profile's ``platform``) and model
(names compared case-insensitively), e.g. ``h200-x8-deepseek-v3.2`` meets Table 6.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from pathlib import Path
from typing import Iterable, Mapping

from ..layouts import LAYOUTS, Layout

TABLES = {"b200": "Table 4", "dcu": "Table 5", "h200": "Table 6"}
PAPER_OUTPUT_TOKENS = 1024  # every request of the paper's sweeps generates 1,024 tokens
TIE_MARGIN = 0.03  # a pick within 3% of the paper's best throughput counts as a tie


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


def batch_seconds(batch: int, input_tokens: int, tokens_per_s: float, output_tokens: int = PAPER_OUTPUT_TOKENS) -> float:
    """T_batch of one position from its total throughput B(L_in + L_out)/T_batch."""
    return batch * (input_tokens + output_tokens) / tokens_per_s


@dataclasses.dataclass(frozen=True)
class Regret:
    """Picks scored by the paper's measurements over some positions: each position's batch
    time in the picked layout, added up, against the oracle (the paper's best layout at every
    position) and against each fixed layout (one layout everywhere)."""

    positions: int
    strict: int  # picks that are the paper's best
    within_ties: int  # picks within ``tie_margin`` of the paper's best throughput
    tie_margin: float
    picks_s: float
    oracle_s: float
    fixed_s: Mapping[Layout, float]
    unpicked: int = 0  # positions where the prediction fit no layout: scored as the paper's slowest

    @property
    def best_fixed(self) -> Layout:
        return min(LAYOUTS, key=lambda l: (self.fixed_s[l], LAYOUTS.index(l)))

    @property
    def picks_over_oracle(self) -> float:
        return self.picks_s / self.oracle_s

    @property
    def best_fixed_over_oracle(self) -> float:
        return self.fixed_s[self.best_fixed] / self.oracle_s

    @property
    def picks_over_best_fixed(self) -> float:
        return self.picks_s / self.fixed_s[self.best_fixed]

    def summary(self) -> dict:
        return {"positions": self.positions, "strict": self.strict, "within_ties": self.within_ties,
                "tie_margin": self.tie_margin, "unpicked": self.unpicked, "picks_s": self.picks_s,
                "oracle_s": self.oracle_s, "fixed_s": {str(l): v for l, v in self.fixed_s.items()},
                "best_fixed": str(self.best_fixed), "picks_over_oracle": self.picks_over_oracle,
                "best_fixed_over_oracle": self.best_fixed_over_oracle,
                "picks_over_best_fixed": self.picks_over_best_fixed}

    def sentence(self) -> str:
        unpicked = f"; {self.unpicked} position(s) without a pick scored as the slowest" if self.unpicked else ""
        return (f"picks agree at {self.strict}/{self.positions} ({self.within_ties} within "
                f"{self.tie_margin:.0%} of the paper's best); their time is {self.picks_over_oracle:.3f}x the "
                f"oracle's and {self.picks_over_best_fixed:.3f}x fixed {self.best_fixed}'s (which is "
                f"{self.best_fixed_over_oracle:.3f}x the oracle's){unpicked}")


def regret(picks: Iterable[tuple[PaperPosition, Layout | None]], tie_margin: float = TIE_MARGIN) -> Regret:
    """Score ``picks`` (per paper position, the predicted best layout, or None where the
    prediction fits none) by the paper's throughputs. ValueError on no positions, or on a
    paper throughput that is not a positive finite number (no time can be scored from it)."""
    n = strict = ties = unpicked = 0
    picks_s = oracle_s = 0.0
    fixed = dict.fromkeys(LAYOUTS, 0.0)
    for paper, pick in picks:
        values = paper.tokens_per_s
        bad = [l for l in LAYOUTS if not (math.isfinite(values[l]) and values[l] > 0)]
        if bad:
            raise ValueError(f"{paper.sweep}, B = {paper.batch}, {paper.input_tokens:,} input: the paper's "
                             f"throughput of {', '.join(map(str, bad))} is not a positive number")
        seconds = {l: batch_seconds(paper.batch, paper.input_tokens, values[l]) for l in LAYOUTS}
        n += 1
        strict += pick is paper.best
        unpicked += pick is None
        chosen = pick if pick is not None else max(LAYOUTS, key=seconds.get)
        ties += values[chosen] >= (1 - tie_margin) * values[paper.best]
        picks_s += seconds[chosen]
        oracle_s += seconds[paper.best]
        for l in LAYOUTS:
            fixed[l] += seconds[l]
    if not n:
        raise ValueError("no positions to score: regret needs at least one of the paper's positions")
    return Regret(n, strict, ties, tie_margin, picks_s, oracle_s, fixed, unpicked)


def repeats(positions: Iterable[PaperPosition]) -> list[tuple[PaperPosition, PaperPosition]]:
    """Positions the paper measured twice (the same B and input length in two sweeps), in table
    order: its own run-to-run noise."""
    first: dict[tuple[int, int], PaperPosition] = {}
    out = []
    for p in positions:
        key = (p.batch, p.input_tokens)
        if key in first:
            out.append((first[key], p))
        else:
            first[key] = p
    return out


def repeat_gap(a: PaperPosition, b: PaperPosition) -> float:
    """The largest relative difference of one layout's two measurements: |a − b| / min(a, b)."""
    return max(abs(a.tokens_per_s[l] - b.tokens_per_s[l]) / min(a.tokens_per_s[l], b.tokens_per_s[l])
               for l in LAYOUTS)
