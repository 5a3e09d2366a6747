"""Per-benchmark shapes of a result's ``summary`` and ``samples`` (contract: docs/results.md).

A benchmark name maps to a :class:`Shape`: the keys its ``summary`` holds, the fields of each
row of its row lists, and the fields every raw sample carries. :func:`validate_shape` is
called by :func:`splash_core.results.validate`, so a writer learns of a mistake when it
writes, and the report never guesses. Results of a benchmark without a shape here pass with
the envelope checks alone; the report lists them as "no renderer".

Field kinds (a trailing ``?`` makes a field optional): ``text`` non-empty string; ``layout``
TP|CP|DP|DOP; ``state`` weights|kv|indexer|recurrent; ``primitive`` discard|all_gather|all_to_all;
``axis`` input_tokens|batch; ``count`` integer >= 0; ``positive`` integer > 0; ``number`` finite
real; ``nonneg`` finite real >= 0; ``fraction`` real in (0, 1]; ``flag`` true|false; ``integer``
any integer; ``phase`` decode|prefill; ``numbers`` non-empty list of finite reals >= 0; ``pairs``
non-empty list of [integer > 0, integer > 0]; ``texts`` list of non-empty strings; ``labels``
non-empty object of names to non-empty strings; ``counts`` non-empty object of names to integers
>= 0; ``rates`` non-empty list of objects of rate names (ending ``gbps`` or ``tflops``) to
finite reals >= 0; ``object`` any object (what another component wrote, shown as is).

Summary keys are checked strictly (an unknown key is an error: it is most often a typo);
samples must carry their listed fields and may carry more (run index, rank ...).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..layouts import Layout, Primitive, State
from .stats import percentile

LAYOUT_NAMES = tuple(l.value for l in Layout)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_list(v: Any, test: Callable[[Any], bool]) -> bool:
    return isinstance(v, list) and v != [] and all(test(x) for x in v)


def _is_names(v: Any, test: Callable[[Any], bool]) -> bool:
    """A non-empty object whose keys are non-empty names and whose values pass ``test``."""
    return (isinstance(v, dict) and v != {} and all(isinstance(k, str) and k.strip() for k in v)
            and all(test(x) for x in v.values()))


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
    "flag": (lambda v: isinstance(v, bool), "true or false"),
    "integer": (_is_int, "an integer"),
    "phase": (lambda v: v in ("decode", "prefill"), "decode or prefill"),
    "numbers": (lambda v: _is_list(v, lambda x: _is_real(x) and x >= 0), "a non-empty list of finite numbers >= 0"),
    "pairs": (lambda v: _is_list(v, lambda p: _is_list(p, lambda x: _is_int(x) and x > 0) and len(p) == 2),
              "a non-empty list of [integer > 0, integer > 0] pairs"),
    "texts": (lambda v: isinstance(v, list) and all(isinstance(x, str) and x.strip() for x in v),
              "a list of non-empty strings"),
    "labels": (lambda v: _is_names(v, lambda x: isinstance(x, str) and x.strip() != ""),
               "a non-empty object of names to non-empty strings"),
    "counts": (lambda v: _is_names(v, lambda x: _is_int(x) and x >= 0), "a non-empty object of names to integers >= 0"),
    "rates": (lambda v: _is_list(v, lambda r: _is_names(r, lambda x: _is_real(x) and x >= 0)
                                 and all(k.endswith(("gbps", "tflops")) for k in r)),
              "a non-empty list of objects of rate names (ending gbps or tflops) to finite numbers >= 0"),
    "object": (lambda v: isinstance(v, dict), "an object"),
}
CONTAINERS = ("rows", "named", "record")  # summary values holding objects of listed fields (see Shape)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What one benchmark's ``summary`` and ``samples`` hold.

    ``summary`` maps each summary key to a kind, or to a container of objects whose fields
    ``rows[key]`` lists: ``"rows"`` a non-empty list of them, ``"named"`` a non-empty object of
    names to them, ``"record"`` one of them; ``row_key`` names the fields that identify a row of
    a list (no two rows may share them). ``summary_names``, when set, is the kind of every
    summary value of a benchmark whose summary keys are names the writer chooses (backends, say)
    rather than fixed keys. ``check_samples(summary, samples, where)`` checks that the summary
    agrees with the samples it was computed from. ``sample`` lists the fields of each raw
    sample. ``measured_only`` are row fields (listed without ``?``) required in measured
    results, optional in paper and model ones. ``sources`` are the provenance values allowed
    (predictions are never "measured").
    """

    doc: str
    summary: Mapping[str, str]
    rows: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    row_key: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    sample: Mapping[str, str] = dataclasses.field(default_factory=dict)
    measured_only: frozenset[str] = frozenset()
    sources: frozenset[str] = frozenset({"measured", "paper"})
    check: Callable[[dict, str], str | None] | None = None
    summary_names: str = ""
    check_samples: Callable[[dict, list, str], str | None] | None = None


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

def _checks_agree(summary: dict, samples: list, where: str) -> str | None:
    """A correctness run's counts say what its samples say (one sample per check)."""
    failed = sum(1 for s in samples if not s["ok"])
    if summary["checks"] != len(samples):
        return f"{where}: summary.checks: is {summary['checks']} but there are {len(samples)} samples"
    if summary["failed"] != failed:
        return f"{where}: summary.failed: is {summary['failed']} but {failed} sample(s) are not ok"
    if summary["all_ok"] != (failed == 0):
        return f"{where}: summary.all_ok: is {summary['all_ok']} but {failed} check(s) failed"
    return None


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


def _conformance_agrees(summary: dict, samples: list, where: str) -> str | None:
    """One sample per backend in the summary; a backend passed exactly when its suite exited 0."""
    backends = [s["backend"] for s in samples]
    if sorted(backends) != sorted(summary):
        return f"{where}: summary: names backends {sorted(summary)} but the samples ran {backends}"
    for i, s in enumerate(samples):
        if summary[s["backend"]] != (s["returncode"] == 0):
            return (f"{where}: summary.{s['backend']}: is {summary[s['backend']]} but samples[{i}] exited with "
                    f"{s['returncode']}")
    return None


_SWEEP_LISTS = ("winner_ms", "winner_rates", "previous_ms", "previous_rates", "speedup_vs_previous")


def _sweep_workloads(summary: dict, where: str) -> str | None:
    """Workload names start with their kernel entry; every per-point list has one value per point,
    a winner comes with its times and rates, and a speed-up with both sides."""
    for name, w in summary["workloads"].items():
        at = f"{where}.workloads[{json.dumps(name)}]"
        if not name.startswith(("decode", "extend")):
            return f"{at}: a workload's name starts with its kernel entry, decode or extend"
        for key in _SWEEP_LISTS:
            if key in w and len(w[key]) != len(w["points"]):
                return f"{at}.{key}: has {len(w[key])} values for {len(w['points'])} points"
        needs = {"winner": ("winner_ms", "winner_rates"), "previous_ms": ("previous_rates",),
                 "speedup_vs_previous": ("winner", "previous_ms")}
        for key, companions in needs.items():
            missing = [c for c in companions if key in w and c not in w]
            if missing:
                return f"{at}: {key} needs {missing[0]}"
    return None


def _sweep_samples_agree(summary: dict, samples: list, where: str) -> str | None:
    for i, s in enumerate(samples):
        if s["workload"] not in summary["workloads"]:
            return f"{where}: samples[{i}].workload: {s['workload']!r} is not in summary.workloads"
    return None


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


_CORRECTNESS_SUMMARY = {"checks": "positive", "failed": "count", "all_ok": "flag"}


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
    "switch_host_profile": Shape(
        doc="host time of the switching step on CPU: overhead over target-ready, the executor's own bookkeeping",
        summary={"workload": "text", "layers": "positive", "directions": "rows"},
        rows={"directions": {"src": "layout", "dst": "layout", "ready_p50_ms": "nonneg", "splash_p50_ms": "nonneg",
                             "overhead_p50_ms": "number", "switch_host_p50_ms": "nonneg", "prepare_p50_ms": "nonneg",
                             "bookkeeping_per_layer_us": "number", "warm_bookkeeping_per_layer_us": "number",
                             "data_p50_ms": "nonneg", "runs": "positive"}},
        row_key={"directions": ("src", "dst")},
        sample={"src": "layout", "dst": "layout", "ready_ms": "nonneg", "splash_ms": "nonneg",
                "bookkeeping_ms": "number"},
    ),
    "precopy_step": Shape(
        doc="host time of a pre-copy's steps against an ordinary step, its handoff and the one-step switch",
        summary={"workload": "text", "layers": "positive", "directions": "rows"},
        rows={"directions": {"src": "layout", "dst": "layout", "ordinary_p50_ms": "nonneg", "precopy_p50_ms": "nonneg",
                             "handoff_p50_ms": "nonneg", "one_step_p50_ms": "nonneg",
                             "precopy_extra_p50_ms": "number", "precopy_host_p50_ms": "nonneg",
                             "handoff_kv_bytes": "count", "one_step_kv_bytes": "count", "paused_steps": "count",
                             "runs": "positive"}},
        row_key={"directions": ("src", "dst")},
        sample={"src": "layout", "dst": "layout", "kind": "text", "wall_ms": "nonneg"},
    ),
    "plan_speed": _TIMING,
    "precopy_planning": _TIMING,
    "scheduler_speed": _TIMING,
    "sampling_speed": dataclasses.replace(_TIMING, doc="wall time of choosing one step's sampled tokens per case: "
                                          "on the logits' device, or row by row on the host, in microseconds"),
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
    "crossovers": Shape(
        doc="where the cost model predicts the fastest layout changes along one axis",
        summary={"axis": "axis", "batch": "positive?", "input_tokens": "positive?", "scenario": "text?",
                 "predicted": "rows"},
        rows={"predicted": {"at": "nonneg", "from": "layout", "to": "layout"}},
        row_key={"predicted": ("at",)},
        sources=frozenset({"model", "paper"}),
        check=_crossover_axis,
    ),
    "mla_correctness": Shape(
        doc="the MLA kernels of each kernel config in the compute format against the torch reference",
        summary=_CORRECTNESS_SUMMARY,
        sample={"config": "text", "heads": "positive", "kernel": "text", "case": "text?", "ok": "flag",
                "max_abs_err_out": "nonneg?", "max_abs_err_lse": "nonneg?"},
        sources=frozenset({"measured"}),
        check_samples=_checks_agree,
    ),
    "kda_correctness": Shape(
        doc="the KDA kernels (flash-linear-attention) against the torch recurrence",
        summary=_CORRECTNESS_SUMMARY,
        sample={"kernel": "text", "ok": "flag", "rel_err_out": "nonneg?", "rel_err_state": "nonneg?",
                "error": "text?"},
        sources=frozenset({"measured"}),
        check_samples=_checks_agree,
    ),
    "runtime_equivalence": Shape(
        doc="the distributed runtime in each layout against a float32 reference with the same rounded weights",
        summary={"passed": "flag", "failed": "texts", "tolerance": "nonneg", "kernels": "text"},
        sample={"model": "text", "layout": "layout", "max_abs_err": "nonneg", "ref_scale": "nonneg",
                "rel_err": "nonneg", "tolerance": "nonneg", "greedy_mismatches": "count",
                "decisive_mismatches": "count", "steps": "positive", "passed": "flag"},
        sources=frozenset({"measured"}),
        check_samples=_equivalence_agrees,
    ),
    "conformance": Shape(
        doc="the conformance suite (pytest --pyargs splash_core.testing) per backend: did it pass",
        summary={},
        summary_names="flag",
        sample={"backend": "text", "returncode": "integer", "summary": "text", "command": "text?"},
        sources=frozenset({"measured"}),
        check_samples=_conformance_agrees,
    ),
    "gpu_rates": Shape(
        doc="the device's memory copy bandwidth and dense matmul rate: the rooflines of the kernel sections",
        summary={"copy_gbps": "nonneg", "matmul_tflops": "nonneg"},
        sample={"copy_gbps": "nonneg", "matmul_tflops": "nonneg"},
        sources=frozenset({"measured"}),
    ),
    "mla_kernel_sweep": Shape(
        doc="candidate attention tiles timed per workload, the winner against the previous kernel",
        summary={"tiles": "labels", "workloads": "named", "previous_config": "object", "tuned_file": "text"},
        rows={"workloads": {"points": "pairs", "heads": "positive", "candidates": "count", "failed": "count",
                            "skipped": "count", "winner": "text?", "winner_ms": "numbers?",
                            "winner_rates": "rates?", "previous_ms": "numbers?", "previous_rates": "rates?",
                            "speedup_vs_previous": "numbers?"}},
        sample={"workload": "text", "kernel": "text", "tile": "text"},
        sources=frozenset({"measured"}),
        check=_sweep_workloads,
        check_samples=_sweep_samples_agree,
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
    "decode_step": Shape(
        doc="a decode step at T = 1, eager against replayed from its captured graph, beside its roofline",
        summary={"rates": "record", "layers": "counts", "memory": "object", "points": "rows", "skipped": "texts"},
        rows={"rates": {"copy_gbps": "nonneg", "matmul_tflops": "nonneg", "copy_mib": "positive",
                        "matmul_n": "positive"},
              "points": {"batch": "positive", "context": "positive", "layers": "positive", "eager_ms": "nonneg",
                         "eager_device_ms": "nonneg?", "eager_unfused_ms": "nonneg?",
                         "eager_unfused_device_ms": "nonneg?", "graph_ms": "nonneg", "replay_ms": "nonneg?",
                         "roofline_ms": "nonneg", "capture_s": "nonneg?", "graph_bytes": "count?",
                         "captured": "flag", "failed": "text?", "tokens_match": "flag", "decisive_mismatches": "count",
                         "wall_over_replay": "nonneg?",
                         "eager_over_graph": "nonneg", "replay_over_roofline": "nonneg?"}},
        row_key={"points": ("batch", "context")},
        sample={"batch": "positive", "context": "positive", "layers": "positive", "layout": "layout", "path": "text"},
        sources=frozenset({"measured"}),
        check_samples=_decode_steps_agree,
    ),
    "copy_interference": Shape(
        doc="a step's slowdown beside one layer's page copies per layer, by copy kind (one GPU)",
        summary={"workload": "text", "rows": "rows"},
        rows={"rows": {"variant": "text", "mib_per_layer": "nonneg", "step_alone_ms": "nonneg", "step_ms": "nonneg",
                       "slowdown_ms": "number", "slowdown_pct": "number", "slowdown_ms_per_gib": "number",
                       "copy_alone_ms": "nonneg", "copies_per_layer": "count"}},
        row_key={"rows": ("variant", "mib_per_layer")},
        sample={"variant": "text", "mib": "nonneg", "run": "count", "step_ms": "nonneg", "copy_alone_ms": "nonneg",
                "bytes_per_layer": "count", "copies_per_layer": "count"},
        sources=frozenset({"measured"}),
    ),
    "peer_kernels": Shape(
        doc="MLA decode of SPLASH's kernel, FlashMLA and SGLang's Triton decode on identical caches (one GPU)",
        summary={"kernels": "object", "rates": "object", "providers": "object", "kernels_fp8": "object?",
                 "providers_fp8": "object?"},
        sample={"kernel": "text", "batch": "positive", "heads": "positive", "context": "positive", "ms": "nonneg",
                "kv_gbps": "nonneg", "tflops": "nonneg", "kv": "text?"},
        sources=frozenset({"measured"}),
    ),
    "served_bench": Shape(
        doc="sglang.bench_serving against splash serve: latency and throughput per request rate",
        summary={"server_command": "text", "server_ready_s": "nonneg", "server_exit_code": "integer",
                 "workload": "object", "runs": "rows", "skipped": "texts", "server_log_tail": "text?"},
        rows={"runs": {"rate": "text", "seconds": "nonneg", "command": "text", "completed": "count",
                       "metrics": "text", "server_info": "object", "bench_serving": "object"}},
        row_key={"runs": ("rate",)},
        sample={"rate": "text", "request": "count", "input_tokens": "positive", "output_tokens": "count",
                "ttft_ms": "nonneg"},
        sources=frozenset({"measured"}),
    ),
    "page_runs": Shape(
        doc="the runs of consecutive pages a simulated serving run leaves KV histories in (what pulls need)",
        summary={"page_bytes": "positive", "min_run_bytes": "nonneg", "rows": "rows"},
        rows={"rows": {"scenario": "text", "pool": "text", "pool_pages": "positive", "peak_used_pages": "count",
                       "step": "count", "requests": "count", "pages": "count", "runs": "count", "plain_runs": "count",
                       "pages_per_run": "nonneg", "median_request_pages_per_run": "nonneg",
                       "worst_request_pages_per_run": "nonneg", "pulled": "flag"}},
        row_key={"rows": ("scenario", "pool", "step")},
        sample={"scenario": "text", "pool": "text", "step": "count"},
        sources=frozenset({"measured"}),
    ),
    "costmodel_check": Shape(
        doc="the cost model's step times against the runtime's measured ones, host term fitted to a subset",
        summary={"measured_file": "text", "hardware": "text", "layers": "positive", "fit": "text",
                 "step_overhead_us": "nonneg", "target_pct": "nonneg?", "variants": "rows", "by_layout": "rows?",
                 "overheads": "rows", "points": "rows"},
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
        if kind.rstrip("?") not in CONTAINERS:
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
    if shape.summary_names:
        error = _check_names(summary, shape.summary_names, f"{where}: summary")
    else:
        error = _check_object(summary, shape.summary, f"{where}: summary", strict=True)
    if error:
        return error
    optional = frozenset() if measured else shape.measured_only
    for key, fields in shape.rows.items():
        if key in summary:  # a container marked optional may be absent
            error = _check_container(shape, key, summary[key], fields, f"{where}: summary.{key}", optional)
            if error:
                return error
    if shape.check:
        error = shape.check(summary, f"{where}: summary")
        if error:
            return error
    for i, sample in enumerate(data["samples"]):
        if shape.sample:
            error = _check_object(sample, shape.sample, f"{where}: samples[{i}]", strict=False)
            if error:
                return error
    if shape.check_samples:
        return shape.check_samples(summary, data["samples"], where)
    return None


def _check_container(shape: Shape, key: str, value: Any, fields: Mapping[str, str], where: str,
                     optional: frozenset[str]) -> str | None:
    """One ``rows``, ``named`` or ``record`` summary value: its objects, each strictly."""
    container = shape.summary[key].rstrip("?")
    if container == "record":
        return _check_object(value, fields, where, strict=True, optional=optional)
    if container == "named":
        if not isinstance(value, dict) or not value:
            return f"{where}: must be a non-empty object of names to objects"
        for name, obj in value.items():
            error = _check_object(obj, fields, f"{where}[{json.dumps(name)}]", strict=True, optional=optional)
            if error:
                return error
        return None
    if not isinstance(value, list) or not value:
        return f"{where}: must be a non-empty list of objects"
    seen: dict[tuple, int] = {}
    for i, row in enumerate(value):
        error = _check_object(row, fields, f"{where}[{i}]", strict=True, optional=optional)
        if error:
            return error
        ident = tuple(row.get(f) for f in shape.row_key.get(key, ()))
        if ident and ident in seen:
            return f"{where}[{i}]: repeats row {seen[ident]} ({ident})"
        seen[ident] = i
    return None


def _check_names(obj: Any, kind: str, where: str) -> str | None:
    """A summary keyed by names the writer chose, every value of ``kind``."""
    if not isinstance(obj, dict) or not obj:
        return f"{where}: must be a non-empty object of names to {KINDS[kind][1]}"
    for name, value in obj.items():
        error = _check_value(value, kind, f"{where}.{name}")
        if error:
            return error
    return None


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
