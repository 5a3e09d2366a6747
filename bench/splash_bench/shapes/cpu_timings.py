"""Shape of the CPU timing programs' results (docs/results.md): bench/plan_speed.py,
bench/precopy_planning.py, bench/scheduler_speed.py and bench/sampling_speed.py each time one
operation per case, so their four benchmarks share one shape and one module.

Registered as entry point ``cpu_timings`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

import dataclasses

from splash_core.results.shapes import Shape

_TIMING = Shape(
    doc="CPU timings of one operation per case, in microseconds",
    summary={"cases": "rows"},
    rows={"cases": {"case": "text", "p50_us": "nonneg", "p95_us": "nonneg", "runs": "positive"}},
    row_key={"cases": ("case",)},
    sample={"case": "text", "us": "nonneg"},
)


SHAPES: dict[str, Shape] = {
    "plan_speed": _TIMING,
    "precopy_planning": _TIMING,
    "scheduler_speed": _TIMING,
    "sampling_speed": dataclasses.replace(_TIMING, doc="wall time of choosing one step's sampled tokens per case: "
                                          "on the logits' device, or row by row on the host, in microseconds"),
}
