"""Graph memory (``graph_memory``, ``bench/graph_memory.py``): what the engine's start-up capture
of every decode bucket held and took, per initial layout and layer count; and, where the file has
it, what forced switches cost in re-captures against holding every layout's weights in stable
buffers (issue 22 §1's choice)."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import table

MIB = float(1 << 20)


def render(result: Result, _ctx: Context) -> list[str]:
    rows = [[s["layout"], str(s["layers"]), str(s["captures"]), f"{s['bytes'] / MIB:.0f}", f"{s['seconds']:.2f}"]
            for s in result["samples"]]
    out = [result.data.get("notes", ""), ""] + table(
        ["initial layout", "layers", "graphs captured", "pool growth MiB", "capture s"], rows, "lrrrr") + [""]
    again = (result.data.get("summary") or {}).get("recapture")
    if again:
        serving = again.get("while_serving") or {}
        n = serving.get("captures", 0)
        out += [f"Through {len(again['switches'])} forced switches ({again['script']}, {again['layers']} layers, "
                f"16 requests decoding): {n} captures while serving took {serving.get('seconds', 0.0):.2f} s of host "
                f"time ({serving.get('seconds', 0.0) / max(n, 1):.2f} s each; why: {', '.join(serving.get('why', []))}), "
                f"against a decode step of {again['decode_step_p50_ms']:.1f} ms (p50). Stable buffers instead would "
                f"hold a second layout's projections for good: {again['stable_buffer_bytes'] / MIB:,.0f} MiB per rank.",
                ""]
    return out
