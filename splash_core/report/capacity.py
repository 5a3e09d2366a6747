"""KV capacity per layout (paper Table 3): the KV pool each rank and the group hold, and the
distinct tokens the group can keep (replicated copies counted once)."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import MISSING, fixed, table

GIB = float(1 << 30)
ORDER = ("TP", "DOP", "CP", "DP")  # Table 3's order


def render(result: Result, _ctx: Context) -> list[str]:
    summary = result["summary"]
    layouts = sorted(summary["layouts"], key=lambda r: ORDER.index(r["layout"]))
    dp = next((r["distinct_tokens"] for r in layouts if r["layout"] == "DP"), None)
    rows = []
    for r in layouts:
        group = r.get("pool_bytes_per_group")
        vs_dp = (r["distinct_tokens"] / dp - 1) * 100 if dp else None
        rows.append([r["layout"], fixed(r["pool_bytes_per_rank"] / GIB, 2),
                     fixed(group / GIB, 2) if group is not None else MISSING,
                     f"{r['distinct_tokens']:,}", f"{vs_dp:+.1f}%" if vs_dp is not None else MISSING])
    lines = [f"Memory fraction {summary['memory_fraction']:g}. GiB = 2^30 bytes.", ""]
    return lines + table(["layout", "GiB per rank", "GiB per group", "distinct tokens", "vs DP-attention"], rows) + [""]
