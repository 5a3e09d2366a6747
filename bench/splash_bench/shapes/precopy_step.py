"""Shape of the results of bench/precopy_step.py: ``precopy_step`` (docs/results.md).

Registered as entry point ``precopy_step`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "precopy_step": Shape(
        doc="host time of a pre-copy's steps against an ordinary step, its handoff and the one-step switch",
        summary={"workload": "text", "layers": "positive", "directions": "rows"},
        rows={"directions": {"src": "layout", "dst": "layout", "ordinary_p50_ms": "nonneg", "precopy_p50_ms": "nonneg",
                             "handoff_p50_ms": "nonneg", "one_step_p50_ms": "nonneg",
                             "precopy_extra_p50_ms": "number", "precopy_host_p50_ms": "nonneg",
                             "handoff_kv_bytes": "count", "one_step_kv_bytes": "count", "paused_steps": "count",
                             "runs": "positive"}},
        row_key={"directions": ("src", "dst")},
        sample={"src": "layout", "dst": "layout", "kind": "text", "wall_ms": "nonneg"},
    ),
}
