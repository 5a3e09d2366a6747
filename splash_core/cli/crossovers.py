"""``splash crossovers --scenario FILE``: where the fastest feasible layout changes along
nominal input length under a scenario's illustrative timing law (Eq 11-12), with each
layout's KV limit (appendix B); ``--plot`` draws the figure (like the paper's Figures 1, 6, 7)."""

from __future__ import annotations

import numpy as np

from ..profiles import load
from ..studies import capacity
from ..studies.timing_law import compile_law, crossovers
from .args import figure_path
from .capacity import fmt_k, limit_rows
from .output import print_json, table

_COLORS = {"TP": "#1f77b4", "DP": "#2ca02c", "CP": "#d62728", "DOP": "#9467bd"}
_LABELS = {"DP": "DP-attention"}


def add_parser(sub) -> None:
    p = sub.add_parser("crossovers", help="fastest-layout crossovers of a scenario's timing law (Eq 11-12)")
    p.add_argument("--scenario", required=True, help="scenario profile: name or path to a .yaml")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="PNG", type=figure_path,
                   help="draw normalized latency per layout to this file (.png, .svg or .pdf)")
    p.set_defaults(func=run)


def run(args) -> int:
    scenario = load("scenario", args.scenario)
    law = compile_law(scenario.timing)
    limits = capacity.scenario_limits(scenario.capacity, tuple(law.costs))
    limit_tokens = {l: lim.tokens for l, lim in limits.items()}
    lo, hi = scenario.range_tokens
    found = crossovers(law, limit_tokens, lo, hi)
    printed = list(scenario.paper.crossovers_k) if scenario.paper else []
    switches = [c for c in found if c.after is not None]
    rows = [{"tokens": c.tokens, "k": c.tokens / 1024, "from": str(c.before), "to": str(c.after), "cause": c.cause,
             "paper_k": printed[i] if i < len(printed) else None} for i, c in enumerate(switches)]
    none_beyond = next((c.tokens for c in found if c.after is None), None)
    if args.plot:
        plot(scenario, limit_tokens, switches, args.plot)
    if args.json:
        print_json({"scenario": scenario.name, "title": scenario.title, "range_tokens": [lo, hi],
                    "crossovers": rows, "no_layout_fits_beyond_tokens": none_beyond,
                    "limits": limit_rows(scenario, limits), "plot": args.plot,
                    "note": "illustrative timing law of the paper (Eq 11-12), not measurements"})
        return 0
    d = scenario.display_decimals
    print(f"{scenario.title}  ({scenario.source})")
    print("illustrative timing law (paper Eq 11-12), not measurements; 1k = 1024 tokens\n")
    body = [(fmt_k(r["tokens"], d), f"{r['from']} -> {r['to']}", r["cause"],
             "-" if r["paper_k"] is None else f"{r['paper_k']:.1f}k") for r in rows]
    print(table(body, ["crossover", "fastest feasible", "cause", "paper"], align="rlll"))
    if none_beyond is not None:
        print(f"no layout fits beyond {fmt_k(none_beyond, d)}")
    print()
    lim_body = [(r["layout"], fmt_k(r["limit_tokens"], d), r["source"]) for r in limit_rows(scenario, limits)]
    print(table(lim_body, ["layout", "KV limit", "how"], align="lrl"))
    if args.plot:
        print(f"\nplot written to {args.plot}")
    return 0


def plot(scenario, limits, switches, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    law = compile_law(scenario.timing)
    lo, hi = scenario.range_tokens
    grid = np.linspace(lo, hi, 2000)
    curves = law.normalized(grid)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    feasible_max = max(float(np.max(v[grid <= (limits.get(l) or np.inf)], initial=0.0)) for l, v in curves.items())
    top = feasible_max * 1.35  # the paper's figures clip the infeasible extrapolation
    band = 0.04 * top
    for layout, values in curves.items():
        name, color = str(layout), _COLORS.get(str(layout), None)
        limit = limits.get(layout)
        ok = grid <= (limit if limit is not None else np.inf)
        ax.plot(grid[ok], values[ok], color=color, lw=2, label=_LABELS.get(name, name))
        if limit is not None and limit < hi:
            ax.plot(grid[~ok], values[~ok], color=color, lw=1, ls="--", alpha=0.6)
            ax.fill_between(grid[~ok], values[~ok] - band, values[~ok], facecolor="none", edgecolor=color,
                            hatch="////", alpha=0.35, lw=0)
            y = float(law.normalized(np.array([limit]))[layout][0])
            ax.plot([limit], [y], marker="x", ms=10, mew=2.5, color=color, ls="none")
            ax.annotate(f"{name} limit", (limit, y), textcoords="offset points", xytext=(4, -14), fontsize=8,
                        color=color)
    fits_somewhere = [l for l in limits.values() if l is not None]
    if fits_somewhere and len(fits_somewhere) == len(curves) and max(fits_somewhere) < hi:
        ax.axvspan(max(fits_somewhere), hi, facecolor="none", edgecolor="grey", hatch="xx", alpha=0.3, lw=0)
    for c in switches:
        y = float(law.normalized(np.array([c.tokens]))[c.before][0])
        ax.plot([c.tokens], [y], marker="o", ms=9, mfc="white", mec="black", mew=1.5, ls="none")
        ax.annotate(f"{c.tokens / 1024:.1f}k", (c.tokens, y), textcoords="offset points", xytext=(-10, 10),
                    fontsize=9)
    ax.set_xlim(0, hi)
    ax.set_ylim(0, top)
    _k_ticks(ax.xaxis, hi)
    ax.set_xlabel("Nominal input length (tokens, 1k = 1024)")
    ax.set_ylabel(f"Normalized latency (relative to {law.reference_layout} at "
                  f"{law.reference_tokens / 1024:g}k; lower is better)")
    ax.set_title(scenario.title)
    ax.legend(loc="upper left")
    if switches:
        _inset(ax, law, switches[0])
    fig.text(0.01, 0.01, "Illustrative timing law of the paper (Eq 11-12), not measurements. "
             "Circles: changes of the fastest feasible layout; crosses and hatching: KV limits.", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _inset(ax, law, first) -> None:
    """Enlarge the first crossover, as the paper's figures do."""
    span = max(first.tokens * 0.6, 4096)
    grid = np.linspace(max(1.0, first.tokens - span), first.tokens + span, 400)
    curves = law.normalized(grid)
    inset = ax.inset_axes([0.36, 0.6, 0.3, 0.33])
    for layout in (first.before, first.after):
        inset.plot(grid, curves[layout], color=_COLORS.get(str(layout)), lw=1.5)
    y = float(law.normalized(np.array([first.tokens]))[first.before][0])
    inset.plot([first.tokens], [y], marker="o", mfc="white", mec="black", ls="none")
    inset.set_title(f"{first.before} / {_LABELS.get(str(first.after), str(first.after))}", fontsize=8)
    inset.tick_params(labelsize=7)
    inset.set_xlim(grid[0], grid[-1])
    _k_ticks(inset.xaxis, grid[-1] - grid[0])


def _k_ticks(axis, span: float) -> None:
    """Ticks at round multiples of 1k = 1024 tokens, labelled in k."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    steps = [s for s in (1, 2, 5, 10, 25, 50, 100, 200) if span / (s * 1024) <= 10]
    axis.set_major_locator(MultipleLocator((steps[0] if steps else 500) * 1024))
    axis.set_major_formatter(FuncFormatter(lambda t, _: f"{t / 1024:.0f}k"))
