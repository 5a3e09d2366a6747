"""Shape of the results of bench/runtime_host_profile.py: ``runtime_host_profile`` (docs/results.md).

Registered as entry point ``runtime_host_profile`` of group ``splash.result_shapes`` in
bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "runtime_host_profile": Shape(
        doc="host time of the runtime per layer and layout, attention kernels excluded, with operation counts",
        summary={"workload": "text", "layers": "positive", "baseline": "text?", "points": "rows"},
        rows={"points": {"layout": "layout", "phase": "text", "runtime_us": "nonneg", "first_layer_us": "nonneg",
                         "kernel_us": "nonneg", "collective_us": "nonneg", "step_ms": "nonneg", "aten_ops": "count",
                         "host_copies": "count", "step_copies": "count", "host_reads": "count",
                         "collectives": "count", "before_runtime_us": "nonneg?", "before_first_layer_us": "nonneg?",
                         "before_step_ms": "nonneg?", "before_aten_ops": "count?", "before_host_copies": "count?",
                         "before_step_copies": "count?", "before_host_reads": "count?",
                         "before_collectives": "count?"}},
        row_key={"points": ("layout", "phase")},
        sample={"layout": "layout", "phase": "text", "runtime_us": "nonneg", "step_ms": "nonneg"},
    ),
}
