"""Shapes of the results of bench/gpu_kernels.py, one benchmark per section: ``gpu_rates``,
``mla_kernel_sweep``, ``mla_correctness``, ``kda_correctness``, ``mla_decode``, ``prefill`` and
``conformance`` (docs/results.md).

Registered as entry point ``gpu_kernels`` of group ``splash.result_shapes`` in bench/pyproject.toml.
"""

from __future__ import annotations

import json

from splash_core.results.shapes import Shape

_CORRECTNESS_SUMMARY = {"checks": "positive", "failed": "count", "all_ok": "flag"}


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


SHAPES: dict[str, Shape] = {
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
    "conformance": Shape(
        doc="the conformance suite (pytest --pyargs splash_core.testing) per backend: did it pass",
        summary={},
        summary_names="flag",
        sample={"backend": "text", "returncode": "integer", "summary": "text", "command": "text?"},
        sources=frozenset({"measured"}),
        check_samples=_conformance_agrees,
    ),
}
