"""Per-benchmark shapes of a result's ``summary`` and ``samples`` (contract: docs/results.md).

A benchmark name maps to a :class:`Shape`: the keys its ``summary`` holds, the fields of each
row of its row lists, and the fields every raw sample carries. :func:`validate_shape` is
called by :func:`splash_core.results.validate`, so a writer learns of a mistake when it
writes, and the report never guesses. Results of a benchmark without a shape here pass with
the envelope checks alone; the report lists them as "no renderer".

Field kinds (a trailing ``?`` makes a field optional): ``text`` non-empty string; ``layout``
TP|CP|DP|DOP; ``state`` weights|kv|indexer|recurrent; ``primitive`` discard|all_gather|all_to_all;
``axis`` input_tokens|batch; ``count`` integer >= 0; ``positive`` integer > 0; ``number`` finite
real; ``nonneg`` finite real >= 0; ``fraction`` real in (0, 1].

Summary keys are checked strictly (an unknown key is an error: it is most often a typo);
samples must carry their listed fields and may carry more (run index, rank ...).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .layouts import Layout, Primitive, State

LAYOUT_NAMES = tuple(l.value for l in Layout)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "text": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "layout": (lambda v: v in LAYOUT_NAMES, "one of " + ", ".join(LAYOUT_NAMES)),
    "state": (lambda v: v in {s.value for s in State}, "one of " + ", ".join(s.value for s in State)),
    "primitive": (lambda v: v in {p.value for p in Primitive}, "one of " + ", ".join(p.value for p in Primitive)),
    "axis": (lambda v: v in ("input_tokens", "batch"), "input_tokens or batch"),
    "count": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "positive": (lambda v: _is_int(v) and v > 0, "an integer > 0"),
    "number": (_is_real, "a finite number"),
    "nonneg": (lambda v: _is_real(v) and v >= 0, "a finite number >= 0"),
    "fraction": (lambda v: _is_real(v) and 0 < v <= 1, "a number in (0, 1]"),
}


@dataclasses.dataclass(frozen=True)
class Shape:
    """What one benchmark's ``summary`` and ``samples`` hold.

    ``summary`` maps each summary key to a kind, or to ``"rows"`` for a list of objects whose
    fields ``rows[key]`` lists; ``row_key`` names the fields that identify a row (no two rows
    may share them). ``sample`` lists the fields of each raw sample. ``measured_only`` are row
    fields (listed without ``?``) required in measured results, optional in paper and model ones. ``sources`` are the
    provenance values allowed (predictions are never "measured").
    """

    doc: str
    summary: Mapping[str, str]
    rows: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    row_key: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    sample: Mapping[str, str] = dataclasses.field(default_factory=dict)
    measured_only: frozenset[str] = frozenset()
    sources: frozenset[str] = frozenset({"measured", "paper"})
    check: Callable[[dict, str], str | None] | None = None


def _crossover_axis(summary: dict, where: str) -> str | None:
    fixed = "batch" if summary["axis"] == "input_tokens" else "input_tokens"
    if fixed not in summary:
        return f"{where}.{fixed}: required when axis is {summary['axis']} (the coordinate held fixed)"
    return None


_SWEEP_POINT = {"sweep": "text", "layout": "layout", "batch": "positive", "input_tokens": "positive",
                "tokens_per_s": "nonneg", "runs": "positive?"}
_DIRECTION = {"src": "layout", "dst": "layout", "ready_p50_ms": "nonneg", "blocking_p50_ms": "nonneg",
              "splash_p50_ms": "nonneg", "blocking_overhead_p50_ms": "number",
              "blocking_overhead_p95_ms": "number", "splash_overhead_p50_ms": "number",
              "splash_overhead_p95_ms": "number", "runs": "positive?"}
_TIMING = Shape(
    doc="CPU timings of one operation per case, in microseconds",
    summary={"cases": "rows"},
    rows={"cases": {"case": "text", "p50_us": "nonneg", "p95_us": "nonneg", "runs": "positive"}},
    row_key={"cases": ("case",)},
    sample={"case": "text", "us": "nonneg"},
)

SHAPES: dict[str, Shape] = {
    "fixed_layout_sweep": Shape(
        doc="total throughput B(L_in + output_tokens)/T_batch of each layout at each (batch, input_tokens)",
        summary={"output_tokens": "positive?", "points": "rows"},
        rows={"points": _SWEEP_POINT},
        row_key={"points": ("sweep", "layout", "batch", "input_tokens")},
        sample={"sweep": "text", "layout": "layout", "batch": "positive", "input_tokens": "positive",
                "tokens_per_s": "nonneg"},
    ),
    "primitive_costs": Shape(
        doc="per-layer network cost of each switch primitive, per state and direction",
        summary={"workload": "text", "costs": "rows"},
        rows={"costs": {"state": "state", "src": "layout", "dst": "layout", "per_layer_ms": "nonneg",
                        "per_layer_ms_p95": "nonneg?", "bytes": "count", "primitive": "primitive"}},
        row_key={"costs": ("state", "src", "dst")},
        sample={"state": "state", "src": "layout", "dst": "layout", "per_layer_ms": "nonneg"},
        measured_only=frozenset({"bytes", "primitive"}),
    ),
    "switch_overhead": Shape(
        doc="step time of the switching step: target-ready, blocking and SPLASH, with overheads",
        summary={"workload": "text", "directions": "rows"},
        rows={"directions": _DIRECTION},
        row_key={"directions": ("src", "dst")},
        sample={"src": "layout", "dst": "layout", "ready_ms": "nonneg", "blocking_ms": "nonneg",
                "splash_ms": "nonneg"},
    ),
    "kv_capacity": Shape(
        doc="KV pool and distinct tokens the group holds in each layout",
        summary={"memory_fraction": "fraction", "layouts": "rows"},
        rows={"layouts": {"layout": "layout", "pool_bytes_per_rank": "count", "pool_bytes_per_group": "count?",
                          "distinct_tokens": "count"}},
        row_key={"layouts": ("layout",)},
        sample={"layout": "layout", "pool_bytes_per_rank": "count", "distinct_tokens": "count"},
    ),
    "mla_decode": Shape(
        doc="decode attention bandwidth per (batch, context) against the copy bandwidth of the same run",
        summary={"copy_gbps": "nonneg", "peak_gbps": "nonneg?", "points": "rows"},
        rows={"points": {"kernel": "text", "batch": "positive", "context": "positive", "time_ms": "nonneg",
                         "bytes": "count?", "achieved_gbps": "nonneg"}},
        row_key={"points": ("kernel", "batch", "context")},
        sample={"kernel": "text", "batch": "positive", "context": "positive", "time_ms": "nonneg"},
    ),
    "prefill": Shape(
        doc="prefill attention compute rate against the matmul rate of the same run",
        summary={"matmul_tflops": "nonneg", "peak_tflops": "nonneg?", "points": "rows"},
        rows={"points": {"kernel": "text", "batch": "positive", "input_tokens": "positive", "context": "count?",
                         "time_ms": "nonneg", "achieved_tflops": "nonneg"}},
        row_key={"points": ("kernel", "batch", "input_tokens", "context")},
        sample={"kernel": "text", "batch": "positive", "input_tokens": "positive", "time_ms": "nonneg"},
    ),
    "plan_speed": _TIMING,
    "scheduler_speed": _TIMING,
    "rollout_serving": Shape(
        doc="one workload served end to end by the engine under SPLASH and under each fixed layout",
        summary={"workload": "text", "output_tokens": "count", "best_fixed": "layout",
                 "splash_over_best_fixed": "nonneg", "policies": "rows"},
        rows={"policies": {"policy": "text", "tokens_per_s": "nonneg", "elapsed_s": "nonneg", "steps": "positive",
                           "switches": "count", "served": "count", "layout_steps": "text"}},
        row_key={"policies": ("policy",)},
        sample={"policy": "text", "tokens_per_s": "nonneg"},
    ),
    "crossovers": Shape(
        doc="where the cost model predicts the fastest layout changes along one axis",
        summary={"axis": "axis", "batch": "positive?", "input_tokens": "positive?", "scenario": "text?",
                 "predicted": "rows"},
        rows={"predicted": {"at": "nonneg", "from": "layout", "to": "layout"}},
        row_key={"predicted": ("at",)},
        sources=frozenset({"model", "paper"}),
        check=_crossover_axis,
    ),
}


def _check_value(value: Any, kind: str, where: str) -> str | None:
    test, description = KINDS[kind.rstrip("?")]
    if not test(value):
        return f"{where}: must be {description} (got {value!r})"
    return None


def _check_object(obj: Any, fields: Mapping[str, str], where: str, *, strict: bool,
                  optional: frozenset[str] = frozenset()) -> str | None:
    if not isinstance(obj, dict):
        return f"{where}: must be an object (got {type(obj).__name__})"
    for name, kind in fields.items():
        if name not in obj:
            if kind.endswith("?") or name in optional:
                continue
            return f"{where}: missing field {name!r}"
        if kind != "rows":
            error = _check_value(obj[name], kind, f"{where}.{name}")
            if error:
                return error
    if strict:
        unknown = sorted(set(obj) - set(fields))
        if unknown:
            return f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(fields)})"
    if "src" in fields and "dst" in fields and obj.get("src") == obj.get("dst"):
        return f"{where}: src and dst must differ (got {obj.get('src')!r} twice)"
    return None


def shape_error(data: dict, where: str) -> str | None:
    """The first way ``data`` breaks its benchmark's shape, as 'file: field.path: what', or None."""
    shape = SHAPES.get(data["benchmark"])
    if shape is None:
        return None
    if data["source"] not in shape.sources:
        return (f"{where}: source: {data['benchmark']} results must be {' or '.join(sorted(shape.sources))}"
                f" (got {data['source']!r})")
    measured = data["source"] == "measured"
    summary = data["summary"]
    error = _check_object(summary, shape.summary, f"{where}: summary", strict=True)
    if error:
        return error
    for key, fields in shape.rows.items():
        rows = summary[key]
        if not isinstance(rows, list) or not rows:
            return f"{where}: summary.{key}: must be a non-empty list of objects"
        optional = frozenset() if measured else shape.measured_only
        seen: dict[tuple, int] = {}
        for i, row in enumerate(rows):
            error = _check_object(row, fields, f"{where}: summary.{key}[{i}]", strict=True, optional=optional)
            if error:
                return error
            ident = tuple(row.get(f) for f in shape.row_key.get(key, ()))
            if ident and ident in seen:
                return f"{where}: summary.{key}[{i}]: repeats row {seen[ident]} ({ident})"
            seen[ident] = i
    if shape.check:
        error = shape.check(summary, f"{where}: summary")
        if error:
            return error
    for i, sample in enumerate(data["samples"]):
        if shape.sample:
            error = _check_object(sample, shape.sample, f"{where}: samples[{i}]", strict=False)
            if error:
                return error
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default), the definition every summary here uses."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def switch_overhead_summary(samples: Sequence[Mapping[str, Any]]) -> list[dict]:
    """``summary.directions`` from matched runs (paper Eq 15): each sample is one run of one
    direction with its ready, blocking and SPLASH step times; overheads are per-run
    differences against the same run's target-ready time, then p50/p95 over runs."""
    by_direction: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for s in samples:
        by_direction.setdefault((s["src"], s["dst"]), []).append(s)
    rows = []
    for (src, dst), runs in by_direction.items():
        blocking = [r["blocking_ms"] - r["ready_ms"] for r in runs]
        splash = [r["splash_ms"] - r["ready_ms"] for r in runs]
        rows.append({
            "src": src, "dst": dst,
            "ready_p50_ms": percentile([r["ready_ms"] for r in runs], 50),
            "blocking_p50_ms": percentile([r["blocking_ms"] for r in runs], 50),
            "splash_p50_ms": percentile([r["splash_ms"] for r in runs], 50),
            "blocking_overhead_p50_ms": percentile(blocking, 50),
            "blocking_overhead_p95_ms": percentile(blocking, 95),
            "splash_overhead_p50_ms": percentile(splash, 50),
            "splash_overhead_p95_ms": percentile(splash, 95),
            "runs": len(runs),
        })
    return rows
