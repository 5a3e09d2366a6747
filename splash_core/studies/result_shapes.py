"""Shapes of the paper's results, the benchmarks the core itself writes (contract: docs/results.md).

``splash sweep --out`` writes ``fixed_layout_sweep`` (the cost model's prediction of the paper's
sweeps), and ``splash report`` reads the paper's numbers (bench/reference/*.csv) as results of
all five: ``fixed_layout_sweep``, ``primitive_costs``, ``switch_overhead``, ``kv_capacity`` and
``crossovers`` (:mod:`splash_core.report.paper`). Their shapes live in the core so its own
writers and readers are checked without the bench distribution, whose programs measure the
same benchmarks. The results room may not import this room: it finds them through the entry
point ``studies`` of group ``splash.result_shapes`` in the core's pyproject.toml.
"""

from __future__ import annotations

from ..results.shapes import Shape


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


SHAPES: dict[str, Shape] = {
    "fixed_layout_sweep": Shape(
        doc="total throughput B(L_in + output_tokens)/T_batch of each layout at each (batch, input_tokens)",
        summary={"output_tokens": "positive?", "points": "rows"},
        rows={"points": _SWEEP_POINT},
        row_key={"points": ("sweep", "layout", "batch", "input_tokens")},
        sample={"sweep": "text", "layout": "layout", "batch": "positive", "input_tokens": "positive",
                "tokens_per_s": "nonneg"},
        sources=frozenset({"measured", "paper", "model"}),  # model: `splash sweep --out`'s predictions
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
