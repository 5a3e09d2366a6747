"""Runtime step times (``runtime_step``): one decode step and one prefill chunk of the distributed
runtime in each layout at each context, in milliseconds, with the layers, batch and query rows
they covered and the per-rank memory plan that chose the layer count; a small plot per phase."""

from __future__ import annotations

from ..results import Result
from . import figures
from .context import Context
from .markdown import MISSING, bold, ms, table, tokens

LAYOUTS = ("TP", "CP", "DP", "DOP")
PHASES = ("decode", "prefill")
GIB = float(1 << 30)


def render(result: Result, ctx: Context) -> list[str]:
    summary = result["summary"]
    points = summary["points"]
    memory = summary["memory"]
    reps = sorted({len(s["step_ms"]) for s in result["samples"]})
    per_layer = ", ".join(f"{layout} {b / GIB:.2f}" for layout, b in memory["per_layer_bytes"].items())
    lines = [f"{summary['layers']} layers of {result.data['model']} per step ({summary['layers_fit']} fit the busiest "
             f"layout at the largest context); median of {'/'.join(map(str, reps))} timed runs; a step's time is "
             "its slowest rank's. Rows: query rows of the step over all requests.", "",
             f"Memory plan per rank (GiB): budget {memory['budget_bytes'] / GIB:.2f}, fixed "
             f"{memory['fixed_bytes'] / GIB:.2f}, transient {memory['transient_bytes'] / GIB:.2f}, per layer "
             f"{per_layer}.", "", f"![runtime step times]({_plot(result, ctx)})", ""]
    by_position: dict[tuple, dict[str, float]] = {}
    for p in points:
        by_position.setdefault((PHASES.index(p["phase"]), p["context"], p["batch"], p["rows"]), {})[p["layout"]] = \
            p["median_ms"]
    rows = []
    for (phase, context, batch, n_rows), times in sorted(by_position.items()):
        best = min(times, key=times.get)
        cells = [(bold(ms(times[l])) if l == best else ms(times[l])) if l in times else MISSING for l in LAYOUTS]
        rows.append([PHASES[phase], f"{context:,}", str(batch), str(n_rows), *cells, best])
    paths = sorted({p.get("path", "eager") for p in points if p["phase"] == "decode"})
    how = f" Decode steps ran: {', '.join(paths)} (replay: from captured graphs); prefill eagerly." if paths else ""
    lines += [f"Step time in ms; the fastest layout in bold.{how}", ""]
    lines += table(["phase", "context", "B", "rows", *LAYOUTS, "fastest"], rows, "lrrrrrrrl") + [""]
    if summary["skipped"]:
        lines += [f"Skipped (time budget): {', '.join(summary['skipped'])}.", ""]
    return lines


def _plot(result: Result, ctx: Context) -> str:
    points = result["summary"]["points"]
    phases = [ph for ph in PHASES if any(p["phase"] == ph for p in points)]
    batches = sorted({p["batch"] for p in points})
    styles = dict(zip(batches, ("-", "--", ":", "-.") * len(batches)))  # one line per (layout, batch)
    fig, axes = figures.figure(1, len(phases), width=2.9, height=2.1)
    for ax, phase in zip(axes[0], phases):
        for layout in LAYOUTS:
            for batch in batches:
                pts = sorted((p["context"], p["median_ms"]) for p in points
                             if p["phase"] == phase and p["layout"] == layout and p["batch"] == batch)
                if pts:
                    label = figures.LAYOUT_NAMES[layout] + (f", B = {batch}" if len(batches) > 1 else "")
                    ax.plot([c for c, _ in pts], [t for _, t in pts], marker=figures.LAYOUT_MARKERS[layout],
                            markersize=3, linewidth=1, linestyle=styles[batch], color=figures.LAYOUT_COLORS[layout],
                            label=label)
        contexts = sorted({p["context"] for p in points if p["phase"] == phase})
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, [tokens(c) for c in contexts])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("step ms")
        ax.set_title(f"one {phase} step")
        ax.grid(alpha=0.3)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside right upper", frameon=False)
    d = result.data
    fig.suptitle(f"{d['model']}, T = {d['T']}, {d['source']} on {d['platform']}", fontsize=8)
    path, name = ctx.image_path(result, "steps")
    figures.save(fig, path)
    return name
