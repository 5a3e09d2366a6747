"""Shape of ``rollout_serving`` results (docs/results.md): bench/engine_bench.py's measured runs
and bench/project_t8.py's projections. engine_bench.py's ``fixed_layout_sweep`` files are
checked by the core's shape of the paper's sweeps (:mod:`splash_core.studies.result_shapes`).

Registered as entry point ``engine_bench`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

from splash_core.results.shapes import Shape

SHAPES: dict[str, Shape] = {
    "rollout_serving": Shape(
        doc="one workload served end to end by the engine under SPLASH and under each fixed layout",
        summary={"workload": "text", "output_tokens": "count", "best_fixed": "layout",
                 "splash_over_best_fixed": "nonneg", "policies": "rows"},
        rows={"policies": {"policy": "text", "tokens_per_s": "nonneg", "elapsed_s": "nonneg", "steps": "positive",
                           "switches": "count", "served": "count", "layout_steps": "text"}},
        row_key={"policies": ("policy",)},
        sample={"policy": "text", "tokens_per_s": "nonneg"},
        sources=frozenset({"measured", "paper", "model"}),  # model: bench/project_t8.py's projections
    ),
}
