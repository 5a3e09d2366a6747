"""Graph memory (``graph_memory``, ``bench/graph_memory.py``): what the engine's start-up capture
of every decode bucket held and took, per initial layout and layer count."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import table

MIB = float(1 << 20)


def render(result: Result, _ctx: Context) -> list[str]:
    rows = [[s["layout"], str(s["layers"]), str(s["captures"]), f"{s['bytes'] / MIB:.0f}", f"{s['seconds']:.2f}"]
            for s in result["samples"]]
    return [result.data.get("notes", ""), ""] + table(
        ["initial layout", "layers", "graphs captured", "pool growth MiB", "capture s"], rows, "lrrrr") + [""]
