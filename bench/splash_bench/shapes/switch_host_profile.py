"""Shape of the results of bench/switch_host_profile.py: ``switch_host_profile`` (docs/results.md).

Registered as entry point ``switch_host_profile`` of group ``splash.result_shapes`` in
bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "switch_host_profile": Shape(
        doc="host time of the switching step on CPU: overhead over target-ready, the executor's own bookkeeping",
        summary={"workload": "text", "layers": "positive", "directions": "rows"},
        rows={"directions": {"src": "layout", "dst": "layout", "ready_p50_ms": "nonneg", "splash_p50_ms": "nonneg",
                             "overhead_p50_ms": "number", "switch_host_p50_ms": "nonneg", "prepare_p50_ms": "nonneg",
                             "bookkeeping_per_layer_us": "number", "warm_bookkeeping_per_layer_us": "number",
                             "data_p50_ms": "nonneg", "runs": "positive"}},
        row_key={"directions": ("src", "dst")},
        sample={"src": "layout", "dst": "layout", "ready_ms": "nonneg", "splash_ms": "nonneg",
                "bookkeeping_ms": "number"},
    ),
}
