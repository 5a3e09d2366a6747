"""Shape of the results of bench/serve_bench.py: ``served_bench`` (docs/results.md).

Registered as entry point ``serve_bench`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "served_bench": Shape(
        doc="sglang.bench_serving against splash serve: latency and throughput per request rate",
        summary={"server_command": "text", "server_ready_s": "nonneg", "server_exit_code": "integer",
                 "workload": "object", "runs": "rows", "skipped": "texts", "server_log_tail": "text?"},
        rows={"runs": {"rate": "text", "seconds": "nonneg", "command": "text", "completed": "count",
                       "metrics": "text", "server_info": "object", "bench_serving": "object"}},
        row_key={"runs": ("rate",)},
        sample={"rate": "text", "request": "count", "input_tokens": "positive", "output_tokens": "count",
                "ttft_ms": "nonneg"},
        sources=frozenset({"measured"}),
    ),
}
