"""Shape of the results of bench/copy_interference.py: ``copy_interference`` (docs/results.md).

Registered as entry point ``copy_interference`` of group ``splash.result_shapes`` in
bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "copy_interference": Shape(
        doc="a step's slowdown beside one layer's page copies per layer, by copy kind (one GPU)",
        summary={"workload": "text", "rows": "rows"},
        rows={"rows": {"variant": "text", "mib_per_layer": "nonneg", "step_alone_ms": "nonneg", "step_ms": "nonneg",
                       "slowdown_ms": "number", "slowdown_pct": "number", "slowdown_ms_per_gib": "number",
                       "copy_alone_ms": "nonneg", "copies_per_layer": "count"}},
        row_key={"rows": ("variant", "mib_per_layer")},
        sample={"variant": "text", "mib": "nonneg", "run": "count", "step_ms": "nonneg", "copy_alone_ms": "nonneg",
                "bytes_per_layer": "count", "copies_per_layer": "count"},
        sources=frozenset({"measured"}),
    ),
}
