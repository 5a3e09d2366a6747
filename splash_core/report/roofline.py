"""Kernel rates against their roofline: MLA decode bandwidth against the memory-copy
bandwidth measured in the same run (``mla_decode``), prefill attention TFLOP/s against the
matmul rate measured in the same run (``prefill``). A datasheet peak, when the result gives
one, is drawn as a second, dotted ceiling."""

from __future__ import annotations

import dataclasses
import math

from ..results import Result
from . import figures
from .context import Context
from .markdown import MISSING, ms, sig, table, tokens

STYLES = ["-", "--", ":", "-."]  # one per kernel, so lines stay apart in grey too


@dataclasses.dataclass(frozen=True)
class Frame:
    """What one roofline plot draws: the point keys of its axes and the ceilings over them."""

    x_key: str
    y_key: str
    unit: str
    ceiling: float
    ceiling_label: str
    peak: float | None
    what: str


def render_decode(result: Result, ctx: Context) -> list[str]:
    """The decode bandwidth plot and one row per point with its share of the copy bandwidth."""
    s = result["summary"]
    image = _plot(result, ctx, Frame("context", "achieved_gbps", "GB/s", s["copy_gbps"], "memory copy, same run",
                                     s.get("peak_gbps"), "decode"))
    rows = [[p["kernel"], str(p["batch"]), f"{p['context']:,}", ms(p["time_ms"]), sig(p["achieved_gbps"]),
             _share(p["achieved_gbps"], s["copy_gbps"])] for p in _ordered(s["points"], "context")]
    lines = [f"Memory copy bandwidth measured in the same run: {sig(s['copy_gbps'])} GB/s"
             + (f"; datasheet peak {sig(s['peak_gbps'])} GB/s" if "peak_gbps" in s else "") + ".", "",
             f"![decode bandwidth]({image})", ""]
    return lines + table(["kernel", "batch", "context", "time ms", "GB/s", "of copy"], rows, "lrrrrr") + [""]


def render_prefill(result: Result, ctx: Context) -> list[str]:
    """The prefill rate plot and one row per point with its share of the matmul rate."""
    s = result["summary"]
    image = _plot(result, ctx, Frame("input_tokens", "achieved_tflops", "TFLOP/s", s["matmul_tflops"],
                                     "matmul, same run", s.get("peak_tflops"), "prefill"))
    rows = [[p["kernel"], str(p["batch"]), f"{p['input_tokens']:,}",
             f"{p['context']:,}" if "context" in p else MISSING, ms(p["time_ms"]),
             sig(p["achieved_tflops"]), _share(p["achieved_tflops"], s["matmul_tflops"])]
            for p in _ordered(s["points"], "input_tokens")]
    lines = [f"Matmul rate measured in the same run: {sig(s['matmul_tflops'])} TFLOP/s"
             + (f"; datasheet peak {sig(s['peak_tflops'])} TFLOP/s" if "peak_tflops" in s else "") + ".", "",
             f"![prefill rate]({image})", ""]
    headers = ["kernel", "batch", "input tokens", "context", "time ms", "TFLOP/s", "of matmul"]
    return lines + table(headers, rows, "lrrrrrr") + [""]


def _share(value: float, ceiling: float) -> str:
    return f"{value / ceiling * 100:.1f}%" if ceiling > 0 else MISSING


def _ordered(points: list[dict], x_key: str) -> list[dict]:
    return sorted(points, key=lambda p: (p["kernel"], p["batch"], p[x_key]))


def _plot(result: Result, ctx: Context, frame: Frame) -> str:
    """One panel of every (kernel, batch) line; one panel per batch instead when that legend would
    pass :data:`figures.LEGEND_MAX` entries (e.g. six kernels at four batch sizes)."""
    points = result["summary"]["points"]
    series = _series(points, frame.x_key)
    batches = sorted({b for _, b in series})
    d = result.data
    title = f"{frame.what}: {d['model']} on {d['platform']} ({d['source']})"
    if len(series) + 1 + bool(frame.peak) > figures.LEGEND_MAX and len(batches) > 1:
        fig = _panel_per_batch(series, batches, points, frame)
        fig.suptitle(title, fontsize=9)
    else:
        fig = _one_panel(series, points, frame)
        fig.axes[0].set_title(title)
    path, name = ctx.image_path(result, frame.what)
    figures.save(fig, path)
    return name


def _series(points: list[dict], x_key: str) -> dict[tuple[str, int], list[dict]]:
    """(kernel, batch) -> its points along ``x_key``."""
    series: dict[tuple[str, int], list[dict]] = {}
    for p in _ordered(points, x_key):
        series.setdefault((p["kernel"], p["batch"]), []).append(p)
    return series


def _one_panel(series: dict, points: list[dict], frame: Frame):
    fig, axes = figures.figure(1, 1, width=5.0, height=3.0)
    ax = axes[0][0]
    kernels = sorted({k for k, _ in series})
    for (kernel, batch), pts in series.items():
        ax.plot([p[frame.x_key] for p in pts], [p[frame.y_key] for p in pts], marker="o", markersize=3, linewidth=1,
                linestyle=STYLES[kernels.index(kernel) % len(STYLES)], label=f"{kernel}, B={batch}")
    _frame(ax, points, frame)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig


def _panel_per_batch(series: dict, batches: list[int], points: list[dict], frame: Frame):
    """A panel per batch size, a line per kernel in the same colour and style in every panel, one
    legend under the panels (kernel names are long; two columns there keep the panels wide)."""
    kernels = sorted({k for k, _ in series})
    cols = min(2, len(batches))
    rows = math.ceil(len(batches) / cols)
    fig, axes = figures.figure(rows, cols, width=3.4, height=2.3)
    for i, batch in enumerate(batches):
        ax = axes[i // cols][i % cols]
        for k, kernel in enumerate(kernels):
            pts = series.get((kernel, batch), [])
            ax.plot([p[frame.x_key] for p in pts], [p[frame.y_key] for p in pts], marker="o", markersize=3,
                    linewidth=1, color=f"C{k % 10}", linestyle=STYLES[k % len(STYLES)], label=kernel)
        _frame(ax, points, frame)
        ax.set_title(f"B = {batch}")
    for j in range(len(batches), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncols=2, frameon=False)
    return fig


def _frame(ax, points: list[dict], frame: Frame) -> None:
    """The ceilings, log-2 axis of the sampled positions, labels and a y range from 0 over everything."""
    ax.axhline(frame.ceiling, color="black", linewidth=1.2, label=frame.ceiling_label)
    if frame.peak:
        ax.axhline(frame.peak, color="gray", linewidth=1, linestyle=":", label="datasheet peak")
    ax.set_xscale("log", base=2)
    xs = sorted({p[frame.x_key] for p in points})
    ax.set_xticks(xs, [tokens(x) for x in xs])
    ax.set_xlabel("context (tokens)" if frame.x_key == "context" else "input tokens")
    ax.set_ylabel(frame.unit)
    top = max([frame.ceiling, frame.peak or 0] + [p[frame.y_key] for p in points])
    ax.set_ylim(0, top * 1.1 or 1)
    ax.grid(alpha=0.3)
