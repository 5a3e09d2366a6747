"""Page runs (``page_runs``): how long the runs of pages are that a simulated serving run leaves
KV histories in, which decides whether a live switch pulls them; ``bench/page_runs.py``."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import table


def render(result: Result, _ctx: Context) -> list[str]:
    s = result["summary"]
    lines = [f"One layer's pool driven through a simulated serving run (the runtime's allocator; pages of "
             f"{s['page_bytes'] / 1024:.0f} KiB): per snapshot, the requests in the batch, their pages, the runs "
             "they lie in (pages at a constant step, one pitched copy each; plain: consecutive pages), the "
             "pages per run over the batch and for its worst request, and whether a pull of the whole "
             f"histories averages {s['min_run_bytes'] / (1 << 20):g} MiB a copy (counting as many runs on the "
             "receiving side), i.e. whether the switch pulls them or moves them by collectives.", ""]
    rows = [[r["scenario"], f"{r['pool']} ({r['pool_pages']}, peak {r['peak_used_pages']})", str(r["step"]),
             str(r["requests"]), str(r["pages"]), str(r["runs"]), str(r["plain_runs"]), f"{r['pages_per_run']:.1f}",
             f"{r['worst_request_pages_per_run']:.1f}", "pulled" if r["pulled"] else "collectives"]
            for r in s["rows"]]
    return lines + table(["scenario", "pool pages", "step", "requests", "pages", "runs", "plain runs",
                          "pages per run", "worst request", "moves by"], rows, "llrrrrrrrl") + [""]
