"""The ``switch_overhead`` summary of bench/switch_bench.py's matched runs (paper Eq 15).

Beside the switch benchmark's rank-side helpers (:mod:`splash_bench.switch`) but in a module of
its own, so whoever summarises or checks switch runs (the driver, the results tests) needs no
torch and no runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from splash_core.results.stats import percentile


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
