"""Runtime step times (``runtime_step``): one decode step and one prefill chunk of the distributed
runtime in each layout at each context, in milliseconds, with the layers, batch and query rows
they covered and the per-rank memory plan that chose the layer count; a small plot per phase."""

from __future__ import annotations

import statistics

from matplotlib.lines import Line2D

from ..results import Result
from . import figures
from .context import Context
from .markdown import MISSING, bold, ms, table, tokens

LAYOUTS = ("TP", "CP", "DP", "DOP")
PHASES = ("decode", "prefill")
GIB = float(1 << 30)
ONE_DEVICE_COLOR = "#333333"
ALL_LAYOUTS = "all layouts (T = 1)"  # one computation at T = 1: one line, not four equal ones
RANGE_LABEL = "range over the four layouts"


def render(result: Result, ctx: Context) -> list[str]:
    """The memory plan, the plot, and one row per phase, context and batch with each layout's time."""
    summary = result["summary"]
    points = summary["points"]
    lines = _intro(result) + [f"![runtime step times]({_plot(result, ctx)})", ""]
    if result.data["T"] == 1:
        lines += ["At T = 1 the four layouts are one computation on one device: the plot draws one line per "
                  "batch, the median of the layouts' times with their range shaded; the table keeps each "
                  "layout's time.", ""]
    paths = sorted({p.get("path", "eager") for p in points if p["phase"] == "decode"})
    how = f" Decode steps ran: {', '.join(paths)} (replay: from captured graphs); prefill eagerly." if paths else ""
    lines += [f"Step time in ms; the fastest layout in bold.{how}", ""]
    lines += table(["phase", "context", "B", "rows", *LAYOUTS, "fastest"], _rows(points), "lrrrrrrrl") + [""]
    if summary["skipped"]:
        lines += [f"Skipped (time budget): {', '.join(summary['skipped'])}.", ""]
    return lines


def _intro(result: Result) -> list[str]:
    summary = result["summary"]
    memory = summary["memory"]
    reps = sorted({len(s["step_ms"]) for s in result["samples"]})
    per_layer = ", ".join(f"{layout} {b / GIB:.2f}" for layout, b in memory["per_layer_bytes"].items())
    return [f"{summary['layers']} layers of {result.data['model']} per step ({summary['layers_fit']} fit the busiest "
            f"layout at the largest context); median of {'/'.join(map(str, reps))} timed runs; a step's time is "
            "its slowest rank's. Rows: query rows of the step over all requests.", "",
            f"Memory plan per rank (GiB): budget {memory['budget_bytes'] / GIB:.2f}, fixed "
            f"{memory['fixed_bytes'] / GIB:.2f}, transient {memory['transient_bytes'] / GIB:.2f}, per layer "
            f"{per_layer}.", ""]


def _rows(points: list[dict]) -> list[list[str]]:
    by_position: dict[tuple, dict[str, float]] = {}
    for p in points:
        key = (PHASES.index(p["phase"]), p["context"], p["batch"], p["rows"])
        by_position.setdefault(key, {})[p["layout"]] = p["median_ms"]
    rows = []
    for (phase, context, batch, n_rows), times in sorted(by_position.items()):
        best = min(times, key=times.get)
        cells = [(bold(ms(times[l])) if l == best else ms(times[l])) if l in times else MISSING for l in LAYOUTS]
        rows.append([PHASES[phase], f"{context:,}", str(batch), str(n_rows), *cells, best])
    return rows


def _plot(result: Result, ctx: Context) -> str:
    """A panel per phase: a line per layout (and batch), or at T = 1 one line per batch for all
    layouts, which are then the same computation."""
    points = result["summary"]["points"]
    phases = [ph for ph in PHASES if any(p["phase"] == ph for p in points)]
    batches = sorted({p["batch"] for p in points})
    styles = dict(zip(batches, ("-", "--", ":", "-.") * len(batches)))  # one line style per batch
    one_device = result.data["T"] == 1
    fig, axes = figures.figure(1, len(phases), width=2.9, height=2.1)
    for ax, phase in zip(axes[0], phases):
        mine = [p for p in points if p["phase"] == phase]
        if one_device:
            _all_layouts(ax, mine, batches, styles)
        else:
            _per_layout(ax, mine, batches, styles)
        _axes(ax, mine, phase)
    where = dict(loc="outside lower center", ncols=2) if one_device else dict(loc="outside right upper")
    fig.legend(*_legend(axes[0], batches, styles, one_device), frameon=False, **where)
    d = result.data
    fig.suptitle(f"{d['model']}, T = {d['T']}, {d['source']} on {d['platform']}", fontsize=8)
    path, name = ctx.image_path(result, "steps")
    figures.save(fig, path)
    return name


def _per_layout(ax, points: list[dict], batches: list[int], styles: dict) -> None:
    for layout in LAYOUTS:
        for batch in batches:
            pts = sorted((p["context"], p["median_ms"]) for p in points if p["layout"] == layout and p["batch"] == batch)
            if pts:
                label = figures.LAYOUT_NAMES[layout] + (f", B = {batch}" if len(batches) > 1 else "")
                ax.plot([c for c, _ in pts], [t for _, t in pts], marker=figures.LAYOUT_MARKERS[layout],
                        markersize=3, linewidth=1, linestyle=styles[batch], color=figures.LAYOUT_COLORS[layout],
                        label=label)


def _all_layouts(ax, points: list[dict], batches: list[int], styles: dict) -> None:
    """At T = 1 every layout runs the same step on one device: per batch the median over the
    layouts' times as one line, their range shaded (run-to-run noise, not a layout effect)."""
    for batch in batches:
        by_context: dict[int, list[float]] = {}
        for p in points:
            if p["batch"] == batch:
                by_context.setdefault(p["context"], []).append(p["median_ms"])
        contexts = sorted(by_context)
        if not contexts:
            continue
        ax.fill_between(contexts, [min(by_context[c]) for c in contexts], [max(by_context[c]) for c in contexts],
                        color=ONE_DEVICE_COLOR, alpha=0.2, linewidth=0, label=RANGE_LABEL)
        ax.plot(contexts, [statistics.median(by_context[c]) for c in contexts], marker="o", markersize=3,
                linewidth=1, linestyle=styles[batch], color=ONE_DEVICE_COLOR,
                label=ALL_LAYOUTS + (f", B = {batch}" if len(batches) > 1 else ""))


def _axes(ax, points: list[dict], phase: str) -> None:
    contexts = sorted({p["context"] for p in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [tokens(c) for c in contexts])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("step ms")
    ax.set_title(f"one {phase} step")
    ax.grid(alpha=0.3)


def _legend(panels, batches: list[int], styles: dict, one_device: bool) -> tuple[list, list[str]]:
    """The panels' entries, one each; with several batches at T >= 2, a colour per layout and a
    line style per batch instead of an entry per (layout, batch)."""
    unique = {}  # the shaded range and every line repeat per panel (and the range per batch): once each
    for ax in panels:
        handles, labels = ax.get_legend_handles_labels()
        unique.update((label, handle) for label, handle in zip(labels, handles) if label not in unique)
    if RANGE_LABEL in unique:  # last, after the lines
        unique[RANGE_LABEL] = unique.pop(RANGE_LABEL)
    if one_device or len(batches) == 1:
        return list(unique.values()), list(unique)
    drawn = [l for l in LAYOUTS if any(label.startswith(f"{figures.LAYOUT_NAMES[l]}, ") for label in unique)]
    layouts = [Line2D([], [], color=figures.LAYOUT_COLORS[l], marker=figures.LAYOUT_MARKERS[l], markersize=3,
                      linewidth=1) for l in drawn]
    lines = [Line2D([], [], color="black", linewidth=1, linestyle=styles[b]) for b in batches]
    return layouts + lines, [figures.LAYOUT_NAMES[l] for l in drawn] + [f"B = {b}" for b in batches]
