"""The switch overhead table (paper Tables 1, 7, 8): for each directed switch, the p50 step
time of target-ready, blocking and SPLASH, and the p50 (p95) overheads over target-ready.

Two derived columns answer the paper's two claims: SPLASH's p50 overhead as a share of the
target-ready step, and how much of the blocking overhead SPLASH removes at p50. Where the run
recorded it (``splash_parts``), a second table splits SPLASH's overhead into the causes the
paper's quantiles leave together: checks before the first layer, the first layer's wait, later
layers' waits, interference (computing slower beside the transfers), and the wait after the last
layer for the first moving layer, which SPLASH moves after the step."""

from __future__ import annotations

from ..layouts import DIRECTIONS
from ..results import Result
from .context import Context
from .markdown import MISSING, fixed, ms, table

HEADERS = ["direction", "ready T p50", "blocking T p50", "SPLASH T p50", "blocking ΔT p50 (p95)",
           "SPLASH ΔT p50 (p95)", "SPLASH ΔT / ready", "ΔT removed vs blocking"]
PARTS = (("before_first_ms_p50", "before layer 0"), ("first_wait_ms_p50", "layer 0 waits"),
         ("later_waits_ms_p50", "later waits"), ("compute_ms_p50", "interference"),
         ("after_last_ms_p50", "after the last layer"))


def render(result: Result, _ctx: Context) -> list[str]:
    """One row per directed switch in the paper's order, then SPLASH's overhead split by cause."""
    summary = result["summary"]
    order = {(a.value, b.value): i for i, (a, b) in enumerate(DIRECTIONS)}
    directions = summary["directions"]
    rows = [_row(d) for d in sorted(directions, key=lambda d: order[(d["src"], d["dst"])])]
    measured = {(d["src"], d["dst"]) for d in directions}
    missing = [f"{a.value} → {b.value}" for a, b in DIRECTIONS if (a.value, b.value) not in measured]
    runs = {d.get("runs") for d in directions} - {None}
    lines = [f"Workload: {summary['workload']}. Milliseconds"
             + (f"; {', '.join(str(r) for r in sorted(runs))} matched runs per direction" if runs else "") + "."]
    lines += [""] + table(HEADERS, rows) + [""]
    if any(0 < d["blocking_overhead_p50_ms"] < 1 for d in directions):
        lines += ["A removal percentage over a blocking ΔT under 1 ms mostly compares timer noise.", ""]
    if missing:
        lines += [f"Not measured: {', '.join(missing)}.", ""]
    return lines + _parts(result.data.get("splash_parts") or {}, order)


def overhead_share(d: dict) -> float | None:
    """SPLASH's p50 overhead as a percentage of the target-ready step (None without a ready time)."""
    return d["splash_overhead_p50_ms"] / d["ready_p50_ms"] * 100 if d["ready_p50_ms"] > 0 else None


def blocking_removed(d: dict) -> float | None:
    """The percentage of the blocking switch's p50 overhead that SPLASH removes (None without one)."""
    blocking = d["blocking_overhead_p50_ms"]
    return (1 - d["splash_overhead_p50_ms"] / blocking) * 100 if blocking > 0 else None


def _row(d: dict) -> list[str]:
    share, removed = overhead_share(d), blocking_removed(d)
    return [f"{d['src']} → {d['dst']}", ms(d["ready_p50_ms"]), ms(d["blocking_p50_ms"]), ms(d["splash_p50_ms"]),
            f"{ms(d['blocking_overhead_p50_ms'])} ({ms(d['blocking_overhead_p95_ms'])})",
            f"{ms(d['splash_overhead_p50_ms'])} ({ms(d['splash_overhead_p95_ms'])})",
            f"{fixed(share, 2)}%" if share is not None else MISSING,
            f"{fixed(removed, 1)}%" if removed is not None else MISSING]


def _parts(parts: dict, order: dict) -> list[str]:
    if not parts:
        return []
    rows = []
    for key in sorted(parts, key=lambda k: order.get(tuple(k.split("->")), len(order))):
        src, dst = key.split("->")
        values = [parts[key].get(k, 0.0) for k, _ in PARTS]  # files before the deferred first layer: no wait after
        rows.append([f"{src} → {dst}", *(ms(v) for v in values), ms(sum(values))])
    return (["Where SPLASH's overhead goes: per direction, the p50 over runs of SPLASH's step minus the ready "
             "step, part by part, from events on the compute stream at every layer (rank 0; milliseconds; the "
             "parts' p50s need not add up to the overhead's p50 exactly)."]
            + [""] + table(["direction", *(h for _, h in PARTS), "sum"], rows) + [""])
