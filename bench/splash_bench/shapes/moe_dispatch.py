"""Shape of the results of bench/moe_dispatch.py: ``moe_dispatch`` (docs/results.md).

Registered as entry point ``moe_dispatch`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

import math

from splash_core.results.shapes import Shape

PATHS = ("all_reduce", "all_to_all")


def _points_are_their_samples(summary: dict, samples: list, where: str) -> str | None:
    """Each point's time of a path is its slowest rank's, and its ratio that time over its floor."""
    for i, p in enumerate(summary["points"]):
        ranks = [s for s in samples if s["rows"] == p["rows"]]
        if not ranks:
            return f"{where}: summary.points[{i}]: no sample of {p['rows']} rows"
        for path in PATHS:
            slowest = max(s["ms"].get(path, -1.0) for s in ranks)
            if not math.isclose(p[f"{path}_ms"], slowest, rel_tol=1e-9):
                return (f"{where}: summary.points[{i}].{path}_ms: is {p[f'{path}_ms']} but its slowest rank's "
                        f"is {slowest}")
            if not math.isclose(p[f"{path}_over_floor"], p[f"{path}_ms"] / p[f"{path}_floor_ms"], rel_tol=1e-9):
                return f"{where}: summary.points[{i}].{path}_over_floor is not {path}_ms over {path}_floor_ms"
    return None


SHAPES: dict[str, Shape] = {
    "moe_dispatch": Shape(
        doc="one MoE layer's all-reduce and all-to-all paths on T ranks, beside floors measured in the same run",
        summary={"rates": "record", "points": "rows", "hardware_rule": "text"},
        rows={"rates": {"copy_gbps": "nonneg", "matmul_tflops": "nonneg", "copy_mib": "positive",
                        "matmul_n": "positive", "all_gather_gbps": "nonneg", "all_to_all_gbps": "nonneg",
                        "all_reduce_gbps": "nonneg", "collective_latency_us": "nonneg"},
              "points": {"rows": "positive", "all_reduce_ms": "nonneg", "all_to_all_ms": "nonneg",
                         "all_reduce_floor_ms": "nonneg", "all_to_all_floor_ms": "nonneg",
                         "all_reduce_over_floor": "nonneg", "all_to_all_over_floor": "nonneg", "faster": "text",
                         "rule_dispatches": "flag", "mismatch": "texts"}},
        sample={"rank": "count", "rows": "positive", "ms": "object", "error": "nonneg", "sent_rows": "count",
                "pairs_here": "count"},
        sources=frozenset({"measured"}),
        check_samples=_points_are_their_samples,
    ),
}
