"""Switch trace (``switch_trace``): why a SPLASH step is longer than the target-ready one, per
way of running the transfers (``bench/switch_trace.py``'s variants). Overheads are medians of
the untraced runs; the compute stream's busy time comes from rank 0's profiler trace, so its
growth says how much the transfers slowed the step's own kernels (the rest is waiting). Files
from 7610ccd on also time every layer of the untraced steps (``layers``): the growth of rank
0's computing there is the interference without a profiler's host overhead."""

from __future__ import annotations

import statistics

from ..results import Result
from .context import Context
from .markdown import ms, table


def _label(variant: str, seen: dict[str, int]) -> str:
    seen[variant] = seen.get(variant, 0) + 1
    return variant if seen[variant] == 1 else f"{variant} ({seen[variant]})"


def render(result: Result, _ctx: Context) -> list[str]:
    summary, samples = result["summary"], result.data["samples"]
    lines = [f"Workload: {summary['workload']}. Per variant and direction: the target-ready and SPLASH steps "
             "(median of untraced runs, slowest rank), SPLASH's overhead, its waits on transfers, and how much "
             "longer the compute stream was busy in the SPLASH step than in the ready one (its kernels slowed by "
             "the transfers running beside them), traced and, from events at every layer, untraced.", ""]
    rows, seen, pending = [], {}, {}
    for s in samples:
        if "error" in s:
            rows.append([_label(s["variant"], seen), "-", "-", "-", "-", "-", "-", s["error"]])
            continue
        key = (s["variant"], s["src"], s["dst"])
        if s["mode"] == "ready":
            pending[key] = s
            continue
        ready = pending.pop(key, None)
        if ready is None or not s["untraced_ms"] or not ready["untraced_ms"]:
            continue
        if (s["src"], s["dst"]) == (samples[0]["src"], samples[0]["dst"]):
            label = _label(s["variant"], seen)
        r, x = statistics.median(ready["untraced_ms"]), statistics.median(s["untraced_ms"])
        busy = s["timeline"].get("compute_busy_us", 0.0) - ready["timeline"].get("compute_busy_us", 0.0)
        diff = s.get("max_abs_diff_vs_ready")  # files before 0fb9a43 lack it
        notes = [] if diff is None else ["logits = ready's" if diff == 0 else f"logits differ by up to {diff:.3g}"]
        if s.get("deferred_layer") is not None:  # computed the step in its source layout, so not bitwise ready's
            notes.append(f"layer {s['deferred_layer']} moved after the step")
        busy_cell = ms(busy / 1e3)
        if ready["step_ms"] > 2 * r:  # a process's first profiled step can stall hundreds of ms in a collective
            busy_cell = "-"
            notes.append(f"ready trace disturbed ({ms(ready['step_ms'])} ms traced)")
        rows.append([label, f"{s['src']}→{s['dst']}", ms(r), ms(x), ms(x - r), ms(s["exposed_ms"]), busy_cell,
                     _untraced_compute(ready, s), "; ".join(notes)])
    return lines + table(["variant", "direction", "ready ms", "SPLASH ms", "overhead ms", "waits ms",
                          "compute busy +ms", "untraced compute +ms", "note"], rows, "llrrrrrrl") + [""]


def _untraced_compute(ready: dict, splash: dict) -> str:
    """How much longer rank 0 computed in the untraced SPLASH steps than in the ready ones."""
    totals = [(row.get("layers") or [{}])[0].get("totals") for row in (ready, splash)]
    return "-" if None in totals else ms(totals[1]["compute_ms"] - totals[0]["compute_ms"])
