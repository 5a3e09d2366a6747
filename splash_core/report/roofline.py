"""Kernel rates against their roofline: MLA decode bandwidth against the memory-copy
bandwidth measured in the same run (``mla_decode``), prefill attention TFLOP/s against the
matmul rate measured in the same run (``prefill``). A datasheet peak, when the result gives
one, is drawn as a second, dotted ceiling."""

from __future__ import annotations

from ..results import Result
from . import figures
from .context import Context
from .markdown import MISSING, ms, sig, table, tokens


def render_decode(result: Result, ctx: Context) -> list[str]:
    s = result["summary"]
    image = _plot(result, ctx, x_key="context", y_key="achieved_gbps", ceiling=s["copy_gbps"],
                  ceiling_label="memory copy, same run", peak=s.get("peak_gbps"), unit="GB/s", what="decode")
    rows = [[p["kernel"], str(p["batch"]), f"{p['context']:,}", ms(p["time_ms"]), sig(p["achieved_gbps"]),
             _share(p["achieved_gbps"], s["copy_gbps"])] for p in _ordered(s["points"], "context")]
    lines = [f"Memory copy bandwidth measured in the same run: {sig(s['copy_gbps'])} GB/s"
             + (f"; datasheet peak {sig(s['peak_gbps'])} GB/s" if "peak_gbps" in s else "") + ".", "",
             f"![decode bandwidth]({image})", ""]
    return lines + table(["kernel", "batch", "context", "time ms", "GB/s", "of copy"], rows, "lrrrrr") + [""]


def render_prefill(result: Result, ctx: Context) -> list[str]:
    s = result["summary"]
    image = _plot(result, ctx, x_key="input_tokens", y_key="achieved_tflops", ceiling=s["matmul_tflops"],
                  ceiling_label="matmul, same run", peak=s.get("peak_tflops"), unit="TFLOP/s", what="prefill")
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


def _plot(result: Result, ctx: Context, *, x_key: str, y_key: str, ceiling: float, ceiling_label: str,
          peak: float | None, unit: str, what: str) -> str:
    fig, axes = figures.figure(1, 1, width=5.0, height=3.0)
    ax = axes[0][0]
    series: dict[tuple[str, int], list[dict]] = {}
    for p in _ordered(result["summary"]["points"], x_key):
        series.setdefault((p["kernel"], p["batch"]), []).append(p)
    styles = ["-", "--", ":", "-."]
    kernels = sorted({k for k, _ in series})
    for (kernel, batch), pts in series.items():
        ax.plot([p[x_key] for p in pts], [p[y_key] for p in pts], marker="o", markersize=3, linewidth=1,
                linestyle=styles[kernels.index(kernel) % len(styles)], label=f"{kernel}, B={batch}")
    ax.axhline(ceiling, color="black", linewidth=1.2, label=ceiling_label)
    if peak:
        ax.axhline(peak, color="gray", linewidth=1, linestyle=":", label="datasheet peak")
    ax.set_xscale("log", base=2)
    xs = sorted({p[x_key] for p in result["summary"]["points"]})
    ax.set_xticks(xs, [tokens(x) for x in xs])
    ax.set_xlabel("context (tokens)" if x_key == "context" else "input tokens")
    ax.set_ylabel(unit)
    top = max([ceiling, peak or 0] + [p[y_key] for p in result["summary"]["points"]])
    ax.set_ylim(0, top * 1.1 or 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    d = result.data
    ax.set_title(f"{what}: {d['model']} on {d['platform']} ({d['source']})")
    path, name = ctx.image_path(result, what)
    figures.save(fig, path)
    return name
