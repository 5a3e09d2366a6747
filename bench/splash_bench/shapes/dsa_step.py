"""Shape of the results of bench/dsa_step.py: ``dsa_step`` (docs/results.md).

Registered as entry point ``dsa_step`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

import math

from splash_core.results.shapes import Shape
from splash_core.results.stats import percentile


def _points_are_their_samples(summary: dict, samples: list, where: str) -> str | None:
    """Each timed point's median is its sample's, and its roofline the sample's."""
    by_key = {(s["cache"], s.get("phase"), s["context"], s["provider"]): s for s in samples}
    for i, p in enumerate(summary["points"]):
        if "error" in p:
            continue
        s = by_key.get((p["cache"], p["phase"], p["context"], p["provider"]))
        if s is None or "wall_ms" not in s:
            return f"{where}: summary.points[{i}]: no timed sample of {p['provider']} {p['phase']} at {p['context']}"
        median = percentile(s["wall_ms"], 50)
        if not math.isclose(p["ms"], median, rel_tol=1e-9):
            return f"{where}: summary.points[{i}].ms: is {p['ms']} but its sample's median is {median}"
        if not math.isclose(p["roofline_ms"], s["roofline_ms"], rel_tol=1e-9):
            return f"{where}: summary.points[{i}].roofline_ms differs from its sample's"
    return None


SHAPES: dict[str, Shape] = {
    "dsa_step": Shape(
        doc="a DSA model's decode step and prefill chunk, dense against sparse per provider, beside its roofline",
        summary={"rates": "record", "ffn_weights": "text?", "points": "rows", "skipped": "texts",
                 "sparse_providers": "object"},
        rows={"rates": {"copy_gbps": "nonneg", "matmul_tflops": "nonneg", "fp8_matmul_tflops": "nonneg?",
                        "copy_mib": "positive", "matmul_n": "positive"},
              "points": {"cache": "text", "phase": "phase?", "context": "positive", "rows": "positive?",
                         "provider": "text", "finite": "flag?", "ms": "nonneg?", "roofline_ms": "nonneg?",
                         "over_roofline": "nonneg?", "max_logit_diff_vs_triton": "nonneg?",
                         "tokens_match_triton": "flag?", "replayed": "flag?", "error": "text?"}},
        sample={"cache": "text", "sparse": "flag", "provider": "text", "context": "positive"},
        sources=frozenset({"measured"}),
        check_samples=_points_are_their_samples,
    ),
}
