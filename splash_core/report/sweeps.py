"""Fixed-layout throughput sweeps (paper Figures 4, 8, 10; Tables 4-6): one panel per sweep,
a line per layout, the best layout at each sampled position starred and bolded.

A cost-model block (``splash sweep --paper --out``) stands beside the paper's table of its
chapter (same model and T): per position the predicted throughput of every layout with its
error against the paper's, the predicted and the paper's best layout, and per sweep and table
how many positions agree and how the throughput errors spread."""

from __future__ import annotations

import dataclasses
import math
import statistics

from ..results import Result
from . import figures
from .context import Context
from .markdown import MISSING, bold, rate, table, tokens

LAYOUTS = ("TP", "CP", "DP", "DOP")


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One sweep of a result: the points sharing a ``sweep`` label, ordered along ``axis``
    (the coordinate that varies); ``fixed`` is the other coordinate when it is constant."""

    label: str
    axis: str  # "input_tokens" or "batch"
    fixed: int | None
    positions: tuple[tuple[int, int], ...]  # (batch, input_tokens), in axis order
    values: dict  # (layout, batch, input_tokens) -> tokens/s

    def value(self, layout: str, position: tuple[int, int]) -> float | None:
        return self.values.get((layout, *position))

    def leader(self, position: tuple[int, int]) -> str | None:
        """The layout with the highest throughput at ``position`` (ties: first of TP, CP, DP, DOP)."""
        best = None
        for layout in LAYOUTS:
            v = self.value(layout, position)
            if v is not None and (best is None or v > self.value(best, position)):
                best = layout
        return best

    def x(self, position: tuple[int, int]) -> int:
        return position[1] if self.axis == "input_tokens" else position[0]

    def x_label(self, position: tuple[int, int]) -> str:
        return tokens(position[1]) if self.axis == "input_tokens" else str(position[0])

    def leader_changes(self) -> list[tuple[str, str, int, int]]:
        """(from, to, last x of the old leader, first x of the new one) along the axis."""
        changes = []
        for a, b in zip(self.positions, self.positions[1:]):
            old, new = self.leader(a), self.leader(b)
            if old and new and old != new:
                changes.append((old, new, self.x(a), self.x(b)))
        return changes


def sweeps(result: Result) -> list[Sweep]:
    """The sweeps of a ``fixed_layout_sweep`` result, in the order their labels first appear."""
    groups: dict[str, list[dict]] = {}
    for point in result["summary"]["points"]:
        groups.setdefault(point["sweep"], []).append(point)
    out = []
    for label, points in groups.items():
        batches = {p["batch"] for p in points}
        inputs = {p["input_tokens"] for p in points}
        axis = "batch" if len(batches) > 1 and len(inputs) == 1 else "input_tokens"
        other = batches if axis == "input_tokens" else inputs
        key = (lambda p: (p[1], p[0])) if axis == "input_tokens" else (lambda p: p)
        positions = tuple(sorted({(p["batch"], p["input_tokens"]) for p in points}, key=key))
        values = {(p["layout"], p["batch"], p["input_tokens"]): p["tokens_per_s"] for p in points}
        out.append(Sweep(label, axis, next(iter(other)) if len(other) == 1 else None, positions, values))
    return out


def render(result: Result, ctx: Context) -> list[str]:
    groups = sweeps(result)
    lines = [f"![fixed-layout sweeps]({_plot(result, groups, ctx)})", ""]
    paper = _paper_of(result, ctx) if result.data["source"] == "model" else None
    if paper is not None:
        return lines + _beside_paper(groups, {s.label: s for s in sweeps(paper)}, paper)
    for sweep in groups:
        axis_name = "input tokens" if sweep.axis == "input_tokens" else "batch"
        other_name = "batch" if sweep.axis == "input_tokens" else "input tokens"
        rows = []
        for position in sweep.positions:
            best = sweep.leader(position)
            cells = [rate(sweep.value(l, position)) if sweep.value(l, position) is not None else MISSING
                     for l in LAYOUTS]
            cells = [bold(c) if l == best else c for l, c in zip(LAYOUTS, cells)]
            other = position[0] if sweep.axis == "input_tokens" else position[1]
            rows.append([f"{sweep.x(position):,}", f"{other:,}", *cells, best or MISSING])
        lines += [f"*{sweep.label}* — total throughput in tokens/s; best layout in bold.", ""]
        lines += table([axis_name, other_name, "TP", "CP", "DP", "DOP", "best"], rows, "rrrrrrl") + [""]
    return lines


def _paper_of(result: Result, ctx: Context) -> Result | None:
    """The paper's sweeps this chapter holds for the same model and T, if any."""
    d = result.data
    return next((r for r in ctx.results if r.benchmark == "fixed_layout_sweep" and r.data["source"] == "paper"
                 and r.data["model"].lower() == d["model"].lower() and r.data["T"] == d["T"]), None)


def _beside_paper(groups: list[Sweep], paper: dict[str, Sweep], paper_result: Result) -> list[str]:
    """Per position: predicted tokens/s and error against the paper, the two best layouts."""
    lines, everywhere = [], []
    for sweep in groups:
        ref = paper.get(sweep.label)
        rows, agree, errors = [], 0, []
        for position in sweep.positions:
            cells = []
            for layout in LAYOUTS:
                v, p = sweep.value(layout, position), ref.value(layout, position) if ref else None
                if v is None:
                    cells.append(MISSING)
                    continue
                err = None if not p else (v - p) / p
                errors += [] if err is None else [err]
                cells.append(rate(v) + ("" if err is None else f" ({err:+.0%})"))
            mine, theirs = sweep.leader(position), ref.leader(position) if ref else None
            agree += mine is not None and mine == theirs
            other = position[0] if sweep.axis == "input_tokens" else position[1]
            rows.append([f"{sweep.x(position):,}", f"{other:,}", *cells, mine or MISSING, theirs or MISSING,
                         "yes" if mine and mine == theirs else "no"])
        axis_name = "input tokens" if sweep.axis == "input_tokens" else "batch"
        other_name = "batch" if sweep.axis == "input_tokens" else "input tokens"
        lines += [f"*{sweep.label}* — predicted total throughput in tokens/s (error against the paper's "
                  f"{paper_result.data['reference'].split(',')[0]}); {agree}/{len(sweep.positions)} best layouts "
                  f"agree, {_spread(errors)}.", ""]
        lines += table([axis_name, other_name, "TP", "CP", "DP", "DOP", "best (model)", "best (paper)", "agree"],
                       rows, "rrrrrrlll") + [""]
        everywhere.append((agree, len(sweep.positions), errors))
    agree, n = sum(a for a, _, _ in everywhere), sum(k for _, k, _ in everywhere)
    errors = [e for _, _, errs in everywhere for e in errs]
    return lines + [f"**Agreement with the paper's {paper_result.data['reference'].split(',')[0]}:** the best "
                    f"layout agrees at {agree}/{n} positions ({agree / n:.0%}); {_spread(errors)}.", ""]


def _spread(errors: list[float]) -> str:
    """How throughput errors spread: median |error| and the share within 25%."""
    if not errors:
        return "no throughput to compare"
    absolute = [abs(e) for e in errors]
    within = sum(e <= 0.25 for e in absolute) / len(absolute)
    return f"median |throughput error| {statistics.median(absolute):.0%}, {within:.0%} of throughputs within 25%"


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
        ax.set_title(f"({chr(97 + i)}) {sweep.label}")
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(loc="upper left", frameon=False)
    for j in range(len(groups), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(title, fontsize=9)
    figures.save(fig, path)


def _title(result: Result) -> str:
    d = result.data
    if d["source"] == "paper":
        where = f"paper {d['reference']}"
    elif d["source"] == "model":
        where = f"predicted by the cost model for {d['platform']}" + (f" ({d['variant']})" if d.get("variant") else "")
    else:
        where = f"{d['source']} on {d['platform']}"
    return f"{d['model']}, T = {d['T']} — {where}"
