"""Per-layer cost of the switch primitives (paper Figures 5b/c, 9, 11): one matrix per state,
rows are source layouts, columns destinations, the diagonal is no switch."""

from __future__ import annotations

from ..layouts import State
from ..results import Result
from . import figures
from .context import Context
from .markdown import MISSING, fixed, sig, table

LAYOUTS = ("TP", "CP", "DP", "DOP")
NO_SWITCH = "—"


def per_layer(value: float | None) -> str:
    """Per-layer milliseconds at the paper's precision (three decimals); three significant
    digits below 0.01 ms so small CPU-scale costs do not read as zero."""
    if value is None:
        return MISSING
    return f"{value:.3f}" if value == 0 or value >= 0.01 else f"{value:.3g}"


def matrices(result: Result) -> dict[str, dict[tuple[str, str], dict]]:
    """state -> (src, dst) -> cost row, states in the order of :class:`State`."""
    out: dict[str, dict[tuple[str, str], dict]] = {}
    for state in State:
        rows = {(c["src"], c["dst"]): c for c in result["summary"]["costs"] if c["state"] == state.value}
        if rows:
            out[state.value] = rows
    return out


def render(result: Result, ctx: Context) -> list[str]:
    """The matrices' plot, then one table per state and the bytes each switch moves."""
    states = matrices(result)
    lines = [f"Workload: {result['summary']['workload']}. Milliseconds per layer; 0 means nothing crosses the network.", "",
             f"![primitive costs]({_plot(result, states, ctx)})", ""]
    for state, cells in states.items():
        lines += [f"*{state}* (ms per layer; rows source, columns destination)", ""]
        lines += table(["source \\ destination", *LAYOUTS], _matrix_rows(cells)) + [""]
    return lines + _bytes_table([c for c in result["summary"]["costs"] if "bytes" in c])


def _matrix_rows(cells: dict) -> list[list[str]]:
    return [[f"**{src}**", *(NO_SWITCH if src == dst else per_layer(cells[(src, dst)]["per_layer_ms"])
                             if (src, dst) in cells else MISSING for dst in LAYOUTS)] for src in LAYOUTS]


def _bytes_table(detailed: list[dict]) -> list[str]:
    """Bytes received per layer and the bandwidth, for costs that carry their bytes."""
    if not detailed:
        return []
    rows = []
    for c in detailed:
        seconds = c["per_layer_ms"] / 1e3
        gbps = c["bytes"] / seconds / 1e9 if seconds > 0 and c["bytes"] else None
        rows.append([c["state"], f"{c['src']} → {c['dst']}", c.get("primitive", MISSING), per_layer(c["per_layer_ms"]),
                     per_layer(c.get("per_layer_ms_p95")), fixed(c["bytes"] / 2**20, 2), sig(gbps)])
    return (["Bytes each rank receives per layer and the bandwidth that achieves:", ""]
            + table(["state", "direction", "primitive", "p50 ms", "p95 ms", "MiB", "GB/s"], rows, "lllrrrr") + [""])


def _plot(result: Result, states: dict, ctx: Context) -> str:
    fig, axes = figures.figure(1, len(states), width=2.7, height=2.5)
    for ax, (state, cells) in zip(axes[0], states.items()):
        _matrix(ax, cells)
        ax.set_title(f"{state} (ms per layer)")
    d = result.data
    where = f"paper {d['reference']}" if d["source"] == "paper" else f"{d['source']} on {d['platform']}"
    fig.suptitle(f"{d['model']}, {result['summary']['workload']} — {where}", fontsize=9)
    path, name = ctx.image_path(result, "primitives")
    figures.save(fig, path)
    return name


def _matrix(ax, cells: dict) -> None:
    """One state's costs as a shaded source x destination matrix with its values written in."""
    grid = [[cells[(s, d)]["per_layer_ms"] if (s, d) in cells and s != d else float("nan") for d in LAYOUTS]
            for s in LAYOUTS]
    top = max((v for row in grid for v in row if v == v), default=0) or 1.0
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=top)
    for i, src in enumerate(LAYOUTS):
        for j, dst in enumerate(LAYOUTS):
            text = NO_SWITCH if src == dst else per_layer(grid[i][j]) if (src, dst) in cells else MISSING
            dark = grid[i][j] == grid[i][j] and grid[i][j] > 0.6 * top  # NaN != NaN
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(4), LAYOUTS)
    ax.set_yticks(range(4), LAYOUTS)
    ax.set_xlabel("destination")
    ax.set_ylabel("source")
