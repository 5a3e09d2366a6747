"""Shapes of the results of bench/runtime_step.py: ``runtime_equivalence`` and ``runtime_step``
(docs/results.md).

Registered as entry point ``runtime_step`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

import math

from splash_core.results.shapes import Shape
from splash_core.results.stats import percentile


def _equivalence_agrees(summary: dict, samples: list, where: str) -> str | None:
    """Each layout passed exactly when it met the stated rule, and the summary lists the failures."""
    for i, s in enumerate(samples):
        if s["decisive_mismatches"] > s["greedy_mismatches"]:
            return f"{where}: samples[{i}].decisive_mismatches: more than its greedy_mismatches"
        met = s["rel_err"] <= s["tolerance"] and s["decisive_mismatches"] == 0
        if s["passed"] != met:
            return (f"{where}: samples[{i}].passed: is {s['passed']} but rel_err {s['rel_err']:.3g} against "
                    f"tolerance {s['tolerance']:g} with {s['decisive_mismatches']} decisive mismatch(es) says {met}")
    failed = [f"{s['model']}/{s['layout']}" for s in samples if not s["passed"]]
    if sorted(summary["failed"]) != sorted(failed) or summary["passed"] != (not failed):
        return f"{where}: summary.failed: lists {summary['failed']} but the failing samples are {failed}"
    return None


def _steps_agree(summary: dict, samples: list, where: str) -> str | None:
    """Each point's median_ms is the median of its sample's step times."""
    by_key = {(s["layout"], s["phase"], s["context"], s["batch"]): s for s in samples}
    for i, p in enumerate(summary["points"]):
        sample = by_key.get((p["layout"], p["phase"], p["context"], p["batch"]))
        if sample is None:
            return f"{where}: summary.points[{i}]: no sample of {p['layout']} {p['phase']} at context {p['context']}"
        median = percentile(sample["step_ms"], 50)
        if not math.isclose(p["median_ms"], median, rel_tol=1e-9, abs_tol=1e-12):
            return f"{where}: summary.points[{i}].median_ms: is {p['median_ms']} but its samples' median is {median}"
    return None


SHAPES: dict[str, Shape] = {
    "runtime_equivalence": Shape(
        doc="the distributed runtime in each layout against a float32 reference with the same rounded weights",
        summary={"passed": "flag", "failed": "texts", "tolerance": "nonneg", "kernels": "text"},
        sample={"model": "text", "layout": "layout", "max_abs_err": "nonneg", "ref_scale": "nonneg",
                "rel_err": "nonneg", "tolerance": "nonneg", "greedy_mismatches": "count",
                "decisive_mismatches": "count", "steps": "positive", "passed": "flag"},
        sources=frozenset({"measured"}),
        check_samples=_equivalence_agrees,
    ),
    "runtime_step": Shape(
        doc="one decode step and one prefill chunk of the distributed runtime per layout and context",
        summary={"layers": "positive", "layers_fit": "count", "memory": "record", "points": "rows",
                 "skipped": "texts", "graphs": "text?", "calibrated_profile": "text?"},
        rows={"memory": {"per_layer_bytes": "counts", "fixed_bytes": "count", "transient_bytes": "count",
                         "budget_bytes": "count"},
              "points": {"layout": "layout", "phase": "phase", "context": "positive", "batch": "positive",
                         "rows": "positive", "path": "text?", "median_ms": "nonneg"}},
        row_key={"points": ("layout", "phase", "context", "batch")},
        sample={"layout": "layout", "phase": "phase", "context": "positive", "batch": "positive",
                "rows": "positive", "layers": "positive", "step_ms": "numbers"},
        sources=frozenset({"measured"}),
        check_samples=_steps_agree,
    ),
}
