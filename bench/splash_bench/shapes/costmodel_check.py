"""Shape of the results of bench/costmodel_check.py: ``costmodel_check`` (docs/results.md).

Registered as entry point ``costmodel_check`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "costmodel_check": Shape(
        doc="the cost model's step times against the runtime's measured ones, host term fitted to a subset; "
            "with --dsa, its sparse-attention charges against the runtime's counts (dsa)",
        summary={"measured_file": "text", "hardware": "text", "layers": "positive", "fit": "text",
                 "step_overhead_us": "nonneg", "target_pct": "nonneg?", "variants": "rows", "by_layout": "rows?",
                 "overheads": "rows", "points": "rows", "dsa": "object?"},
        rows={"variants": {"variant": "text", "host_overlap": "nonneg?", "decode_mean_abs_error_pct": "nonneg",
                           "decode_max_abs_error_pct": "nonneg", "prefill_mean_abs_error_pct": "nonneg",
                           "prefill_max_abs_error_pct": "nonneg", "mean_regret_pct": "nonneg",
                           "max_regret_pct": "nonneg", "cases": "positive"},
              "by_layout": {"variant": "text", "layout": "layout", "phase": "phase", "points": "positive",
                            "mean_abs_error_pct": "nonneg", "max_abs_error_pct": "nonneg"},
              "overheads": {"variant": "text", "layout": "layout", "layer_overhead_us": "nonneg",
                            "graph_layer_overhead_us": "nonneg?"},
              "points": {"variant": "text", "layout": "layout", "phase": "phase", "batch": "positive?",
                         "context": "positive", "path": "text?", "role": "text", "measured_ms": "nonneg",
                         "predicted_ms": "nonneg", "error_pct": "number"}},
        row_key={"variants": ("variant",), "by_layout": ("variant", "layout", "phase"),
                 "overheads": ("variant", "layout"), "points": ("variant", "layout", "phase", "batch", "context")},
        sources=frozenset({"model"}),
    ),
}
