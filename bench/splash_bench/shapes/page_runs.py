"""Shape of the results of bench/page_runs.py: ``page_runs`` (docs/results.md).

Registered as entry point ``page_runs`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "page_runs": Shape(
        doc="the runs of consecutive pages a simulated serving run leaves KV histories in (what pulls need)",
        summary={"page_bytes": "positive", "min_run_bytes": "nonneg", "rows": "rows"},
        rows={"rows": {"scenario": "text", "pool": "text", "pool_pages": "positive", "peak_used_pages": "count",
                       "step": "count", "requests": "count", "pages": "count", "runs": "count", "plain_runs": "count",
                       "pages_per_run": "nonneg", "median_request_pages_per_run": "nonneg",
                       "worst_request_pages_per_run": "nonneg", "pulled": "flag"}},
        row_key={"rows": ("scenario", "pool", "step")},
        sample={"scenario": "text", "pool": "text", "step": "count"},
        sources=frozenset({"measured"}),
    ),
}
