"""Shape of the results of bench/decode_step.py: ``decode_step`` (docs/results.md).

Registered as entry point ``decode_step`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

import math

from splash_core.results.shapes import Shape
from splash_core.results.stats import percentile


def _decode_steps_agree(summary: dict, samples: list, where: str) -> str | None:
    """Each point's eager and graph medians are those of its samples' wall times."""
    by_key = {(s["batch"], s["context"], s["path"]): s for s in samples}
    for i, p in enumerate(summary["points"]):
        for path in ("eager", "graph"):
            sample = by_key.get((p["batch"], p["context"], path))
            if sample is None or "wall_ms" not in sample:
                return f"{where}: summary.points[{i}]: no {path} sample of B={p['batch']} at context {p['context']}"
            median = percentile(sample["wall_ms"], 50)
            if not math.isclose(p[f"{path}_ms"], median, rel_tol=1e-9, abs_tol=1e-12):
                return f"{where}: summary.points[{i}].{path}_ms: is {p[f'{path}_ms']} but its samples' median is {median}"
        if "profile" in p and (error := _profile_error(p["profile"])):
            return f"{where}: summary.points[{i}].profile: {error}"
    return None


def _profile_error(profile: dict) -> str | None:
    """Why a profiled replay's split (bench/splash_bench/kernel_classes.py) is not one: its classes'
    shares and the idle share must be finite and >= 0, some kernel must have run, and busy and idle
    time must make up the step's time; or it is ``{"error": why}`` (no profile could be taken)."""
    if set(profile) == {"error"}:
        return None if isinstance(profile["error"], str) and profile["error"].strip() else "an empty error"
    classes = profile.get("classes")
    if not isinstance(classes, dict) or not classes:
        return "no classes"
    shares = [c.get("share") for c in classes.values()] + [profile.get("idle_share")]
    if not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in shares):
        return f"shares {shares} are not finite numbers >= 0"
    busy, idle, step = (profile.get(k) for k in ("busy_us", "idle_gap_us", "step_us"))
    if not (isinstance(busy, (int, float)) and busy > 0 and isinstance(step, (int, float)) and step > 0
            and isinstance(idle, (int, float)) and math.isclose(busy + idle, step, rel_tol=1e-6)):
        return f"busy {busy} us and idle {idle} us do not make up the step's {step} us (or no kernel ran)"
    return None


SHAPES: dict[str, Shape] = {
    "decode_step": Shape(
        doc="a decode step at T = 1, eager against replayed from its captured graph, beside its roofline",
        summary={"rates": "record", "ffn_weights": "text?", "layers": "counts", "memory": "object", "points": "rows", "skipped": "texts"},
        rows={"rates": {"copy_gbps": "nonneg", "matmul_tflops": "nonneg", "fp8_matmul_tflops": "nonneg?",
                        "copy_mib": "positive", "matmul_n": "positive"},
              "points": {"batch": "positive", "context": "positive", "layers": "positive", "eager_ms": "nonneg",
                         "eager_device_ms": "nonneg?", "eager_unfused_ms": "nonneg?",
                         "eager_unfused_device_ms": "nonneg?", "graph_ms": "nonneg", "replay_ms": "nonneg?",
                         "roofline_ms": "nonneg", "capture_s": "nonneg?", "graph_bytes": "count?",
                         "captured": "flag", "failed": "text?", "tokens_match": "flag", "decisive_mismatches": "count",
                         "wall_over_replay": "nonneg?",
                         "eager_over_graph": "nonneg", "replay_over_roofline": "nonneg?", "profile": "object?"}},
        row_key={"points": ("batch", "context")},
        sample={"batch": "positive", "context": "positive", "layers": "positive", "layout": "layout", "path": "text"},
        sources=frozenset({"measured"}),
        check_samples=_decode_steps_agree,
    ),
}
