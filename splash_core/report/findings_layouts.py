"""Findings about layouts and switching: how far the cost model reproduces the paper's
fixed-layout sweeps, what a live switch costs over the target-ready step, and what SPLASH
serves over the best fixed layout. Each is computed as its section computes it."""

from __future__ import annotations

import statistics

from ..results import Result
from .findings_format import finding, of_type, origin, percent
from .platforms import family
from .sweeps_vs_paper import agreement, paper_of, regret_of, table_name
from .switching import blocking_removed, overhead_share


def sweeps_vs_paper(results: list[Result]) -> list[str]:
    """Per cost-model sweep beside a paper table: best layouts agreeing and the throughput errors."""
    items = []
    for predicted in of_type(results, "fixed_layout_sweep", "model"):
        paper = paper_of(predicted, [r for r in results if family(r.platform) == family(predicted.platform)])
        if paper is None:
            continue
        a, scored = agreement(predicted, paper), regret_of(predicted, paper)
        if a.positions:
            regret = f"; scored by the paper's throughputs, {scored.sentence()}" if scored else ""
            items.append(f"{origin(predicted)} against the paper's {table_name(paper)}: best layout agrees at "
                         f"{a.agree}/{a.positions} positions ({a.agree / a.positions:.0%}); {a.spread()}{regret}")
    return finding("Cost model vs the paper's fixed-layout sweeps (Tables 4-6)", items)


def switch_overhead(results: list[Result]) -> list[str]:
    """Per switch-overhead result: the median over directions of SPLASH's overhead over the ready
    step and of the blocking overhead it removes."""
    items = []
    for r in of_type(results, "switch_overhead"):
        directions = r["summary"]["directions"]
        shares = [v for v in map(overhead_share, directions) if v is not None]
        removed = [v for v in map(blocking_removed, directions) if v is not None]
        if not shares:
            continue
        gone = f", removing a median {percent(statistics.median(removed))} of blocking's" if removed else ""
        items.append(f"{origin(r)}: SPLASH's p50 overhead a median {percent(statistics.median(shares))} of the "
                     f"target-ready step{gone} ({len(directions)} directions)")
    return finding("Switch overhead: SPLASH's step over the target-ready one", items)


def serving(results: list[Result]) -> list[str]:
    """Per served workload: SPLASH's throughput over the best fixed layout's."""
    items = [f"{origin(r)}: SPLASH / best fixed layout ({r['summary']['best_fixed']}) "
             f"{r['summary']['splash_over_best_fixed']:.3f}x on `{r['summary']['workload']}`"
             for r in of_type(results, "rollout_serving")]
    return finding("Serving a workload: SPLASH vs the best fixed layout (tokens/s)", items)
