"""A cost-model sweep (``splash sweep --paper --out``) beside the paper's table of its chapter
(same model and T): per position the predicted throughput of every layout with its error
against the paper's, both best layouts, and per sweep and table how many positions agree,
how the throughput errors spread, and the regret of the picks scored by the paper's own
throughputs (:func:`~splash_core.studies.sweep_paper.regret`). The findings at the top of the
report quote the totals."""

from __future__ import annotations

import dataclasses
import statistics

from ..layouts import Layout
from ..results import Result
from ..studies.sweep_paper import PaperPosition, Regret, regret
from .markdown import MISSING, rate, table
from .sweep_data import LAYOUTS, Sweep, sweeps


@dataclasses.dataclass(frozen=True)
class Agreement:
    """How predicted sweeps meet the paper's: positions whose best layouts agree, out of
    ``positions``, and every relative throughput error (predicted - paper) / paper."""

    agree: int = 0
    positions: int = 0
    errors: tuple[float, ...] = ()

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(self.agree + other.agree, self.positions + other.positions, self.errors + other.errors)

    def spread(self) -> str:
        """How throughput errors spread: median |error| and the share within 25%."""
        if not self.errors:
            return "no throughput to compare"
        absolute = [abs(e) for e in self.errors]
        within = sum(e <= 0.25 for e in absolute) / len(absolute)
        return f"median |throughput error| {statistics.median(absolute):.0%}, {within:.0%} of throughputs within 25%"


def paper_of(result: Result, results: list[Result]) -> Result | None:
    """The paper's sweeps among ``results`` for the same model and T as ``result``, if any."""
    d = result.data
    return next((r for r in results if r.benchmark == "fixed_layout_sweep" and r.data["source"] == "paper"
                 and r.data["model"].lower() == d["model"].lower() and r.data["T"] == d["T"]), None)


def agreement(predicted: Result, paper: Result) -> Agreement:
    """The agreement of every sweep of ``predicted`` with the paper's sweep of the same label."""
    theirs = {s.label: s for s in sweeps(paper)}
    total = Agreement()
    for sweep in sweeps(predicted):
        total += _compare(sweep, theirs.get(sweep.label))[1]
    return total


def regret_of(predicted: Result, paper: Result) -> Regret | None:
    """The predicted picks of every position the paper measured every layout at, scored by the
    paper's throughputs (None: no such position)."""
    picks = _picks(sweeps(predicted), {s.label: s for s in sweeps(paper)})
    return regret(picks) if picks else None


def table_name(paper: Result) -> str:
    """The paper's table a sweep comes from: 'Table 6' of 'Table 6, Figure 10'."""
    return paper.data["reference"].split(",")[0]


def beside_paper(groups: list[Sweep], paper: Result) -> list[str]:
    """Per sweep a table of predicted tokens/s with errors against ``paper`` and both best
    layouts, then the agreement over the whole table."""
    theirs = {s.label: s for s in sweeps(paper)}
    lines, total = [], Agreement()
    for sweep in groups:
        rows, agreed = _compare(sweep, theirs.get(sweep.label))
        axis_name, other_name = sweep.axis_names()
        lines += [f"*{sweep.label}* — predicted total throughput in tokens/s (error against the paper's "
                  f"{table_name(paper)}); {agreed.agree}/{agreed.positions} best layouts agree, {agreed.spread()}.", ""]
        lines += table([axis_name, other_name, "TP", "CP", "DP", "DOP", "best (model)", "best (paper)", "agree"],
                       rows, "rrrrrrlll") + [""]
        total += agreed
    lines += [f"**Agreement with the paper's {table_name(paper)}:** the best layout agrees at "
              f"{total.agree}/{total.positions} positions ({total.agree / total.positions:.0%}); "
              f"{total.spread()}.", ""]
    scored = regret(picks) if (picks := _picks(groups, theirs)) else None
    if scored is not None:
        lines += [f"**Regret, scored by the paper's throughputs:** {scored.sentence()}.", ""]
    return lines


def _picks(groups: list[Sweep], theirs: dict) -> list[tuple[PaperPosition, Layout | None]]:
    picks = []
    for sweep in groups:
        ref = theirs.get(sweep.label)
        for position in sweep.positions if ref else ():
            values = {Layout(l): ref.value(l, position) for l in LAYOUTS}
            if all(v is not None for v in values.values()):
                pick = sweep.leader(position)
                picks.append((PaperPosition(sweep.label, *position, values), pick and Layout(pick)))
    return picks


def _compare(sweep: Sweep, ref: Sweep | None) -> tuple[list[list[str]], Agreement]:
    """The table rows of one predicted sweep against the paper's ``ref``, and their agreement."""
    rows, agree, errors = [], 0, []
    for position in sweep.positions:
        cells, errs = _cells(sweep, ref, position)
        errors += errs
        mine, theirs = sweep.leader(position), ref.leader(position) if ref else None
        agree += mine is not None and mine == theirs
        rows.append([f"{sweep.x(position):,}", f"{sweep.other(position):,}", *cells, mine or MISSING,
                     theirs or MISSING, "yes" if mine and mine == theirs else "no"])
    return rows, Agreement(agree, len(sweep.positions), tuple(errors))


def _cells(sweep: Sweep, ref: Sweep | None, position: tuple[int, int]) -> tuple[list[str], list[float]]:
    """Predicted tokens/s of each layout with its error against the paper's, and those errors."""
    cells, errors = [], []
    for layout in LAYOUTS:
        v, p = sweep.value(layout, position), ref.value(layout, position) if ref else None
        if v is None:
            cells.append(MISSING)
            continue
        err = None if not p else (v - p) / p
        errors += [] if err is None else [err]
        cells.append(rate(v) + ("" if err is None else f" ({err:+.0%})"))
    return cells, errors
