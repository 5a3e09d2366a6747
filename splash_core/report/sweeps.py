"""Fixed-layout throughput sweeps (paper Figures 4, 8, 10; Tables 4-6): one panel per sweep,
a line per layout, the best layout at each sampled position starred and bolded.

A cost-model block (``splash sweep --paper --out``) stands beside the paper's table of its
chapter instead (:mod:`.sweeps_vs_paper`). ``splash sweep`` draws its plots with
:func:`plot_sweeps` too."""

from __future__ import annotations

import math

from ..results import Result
from . import figures
from .context import Context
from .markdown import MISSING, bold, rate, table
from .sweep_data import LAYOUTS, Sweep, sweeps
from .sweeps_vs_paper import beside_paper, paper_of

__all__ = ["Sweep", "plot_sweeps", "render", "sweeps"]


def render(result: Result, ctx: Context) -> list[str]:
    """The sweeps' plot, then one table per sweep (beside the paper's for a cost-model block)."""
    groups = sweeps(result)
    lines = [f"![fixed-layout sweeps]({_plot(result, groups, ctx)})", ""]
    paper = paper_of(result, ctx.results) if result.data["source"] == "model" else None
    if paper is not None:
        return lines + beside_paper(groups, paper)
    for sweep in groups:
        lines += [f"*{sweep.label}* — total throughput in tokens/s; best layout in bold.", ""]
        lines += table([*sweep.axis_names(), "TP", "CP", "DP", "DOP", "best"], _rows(sweep), "rrrrrrl") + [""]
    return lines


def _rows(sweep: Sweep) -> list[list[str]]:
    rows = []
    for position in sweep.positions:
        best = sweep.leader(position)
        cells = [rate(sweep.value(l, position)) if sweep.value(l, position) is not None else MISSING for l in LAYOUTS]
        cells = [bold(c) if l == best else c for l, c in zip(LAYOUTS, cells)]
        rows.append([f"{sweep.x(position):,}", f"{sweep.other(position):,}", *cells, best or MISSING])
    return rows


def _plot(result: Result, groups: list[Sweep], ctx: Context) -> str:
    path, name = ctx.image_path(result, "sweeps")
    plot_sweeps(groups, _title(result), path)
    return name


def plot_sweeps(groups: list[Sweep], title: str, path) -> None:
    """One panel per sweep, a line per layout, the best layout starred (the paper's Figures 4, 8, 10)."""
    cols = min(2, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = figures.figure(rows, cols, width=3.6, height=2.4)
    for i, sweep in enumerate(groups):
        ax = axes[i // cols][i % cols]
        _panel(ax, sweep)
        ax.set_title(f"({chr(97 + i)}) {sweep.label}")
        if i == 0:
            ax.legend(loc="upper left", frameon=False)
    for j in range(len(groups), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(title, fontsize=9)
    figures.save(fig, path)


def _panel(ax, sweep: Sweep) -> None:
    """A line per layout along the sweep's positions (evenly spaced), the best starred."""
    xs = range(len(sweep.positions))
    for layout in LAYOUTS:
        pts = [(x, sweep.value(layout, p)) for x, p in zip(xs, sweep.positions) if sweep.value(layout, p) is not None]
        if pts:
            ax.plot([x for x, _ in pts], [v / 1e3 for _, v in pts], marker=figures.LAYOUT_MARKERS[layout],
                    markersize=3, linewidth=1, color=figures.LAYOUT_COLORS[layout], label=figures.LAYOUT_NAMES[layout])
    for x, p in zip(xs, sweep.positions):
        best = sweep.leader(p)
        if best:
            ax.plot(x, sweep.value(best, p) / 1e3, marker="*", markersize=9, color="black", linestyle="none",
                    label="best" if x == 0 else None)
    ax.set_xticks(list(xs), [sweep.x_label(p) for p in sweep.positions])
    ax.set_xlabel("input length (tokens)" if sweep.axis == "input_tokens" else "batch size / concurrency")
    ax.set_ylabel("10³ tokens/s")
    ax.grid(alpha=0.3)


def _title(result: Result) -> str:
    d = result.data
    if d["source"] == "paper":
        where = f"paper {d['reference']}"
    elif d["source"] == "model":
        where = f"predicted by the cost model for {d['platform']}" + (f" ({d['variant']})" if d.get("variant") else "")
    else:
        where = f"{d['source']} on {d['platform']}"
    return f"{d['model']}, T = {d['T']} — {where}"
