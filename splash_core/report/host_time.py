"""Host time (``runtime_host_profile``, ``switch_host_profile``): where a step's and a live
switch's host work goes, per layer, at tiny model widths so the host side stands out. On an
accelerator a layer whose host time exceeds its device time makes the step host-bound, and a
switch's host work then adds to the step instead of hiding behind it."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import ms, table


def _us(value: float) -> str:
    return f"{value:,.0f}"


def _was(row: dict, key: str, fmt) -> str:
    """``row[key]``, with the baseline's value before it when the result carries one."""
    now = fmt(row[key])
    before = row.get(f"before_{key}")
    return now if before is None else f"{fmt(before)} → {now}"


def render_runtime(result: Result, ctx: Context) -> list[str]:
    summary = result["summary"]
    lines = [f"Workload: {summary['workload']}. Per steady layer: the runtime's own CPU time (attention "
             "kernels and collectives excluded), the time inside the attention kernels' calls and inside "
             "the collectives' calls, and the torch operations it issues (each a kernel launch on an "
             "accelerator); the step's median wall time."]
    if summary.get("baseline"):
        lines[0] += f" Before → after: against {summary['baseline']}, measured in the same rounds."
    rows = [[r["layout"], r["phase"], _was(r, "runtime_us", _us), _us(r["kernel_us"]), _us(r["collective_us"]),
             _was(r, "aten_ops", str), str(r["collectives"]), _was(r, "step_ms", ms)] for r in summary["points"]]
    return lines + [""] + table(["layout", "step", "runtime µs/layer", "kernel calls µs", "collective calls µs",
                                 "torch ops/layer", "collectives/layer", "step ms"], rows, "llrrrrrr") + [""]


def render_switch(result: Result, ctx: Context) -> list[str]:
    summary = result["summary"]
    lines = [f"Workload: {summary['workload']}. Per direction (p50 over runs, slowest rank): the target-ready "
             "and SPLASH steps and their difference; the CPU time of the switch's work inside the SPLASH step "
             "(prepare: plan lookup and checks), its bookkeeping per layer (less issuing, waiting for and "
             "packing data) inside the step and for the same switch outside a step (warm), and the CPU time "
             "moving data.", ""]
    rows = [[f"{r['src']}→{r['dst']}", ms(r["ready_p50_ms"]), ms(r["splash_p50_ms"]), ms(r["overhead_p50_ms"]),
             ms(r["switch_host_p50_ms"]), ms(r["prepare_p50_ms"]), _us(r["bookkeeping_per_layer_us"]),
             _us(r["warm_bookkeeping_per_layer_us"]), ms(r["data_p50_ms"])] for r in summary["directions"]]
    lines += table(["direction", "ready ms", "SPLASH ms", "overhead ms", "switch host ms", "prepare ms",
                    "bookkeeping µs/layer", "warm µs/layer", "data ms"], rows, "lrrrrrrrr") + [""]
    base = result.data.get("baseline")
    if base:
        lines += [f"Baseline kept beside it: {base['label']} ({base['date'][:10]}).", ""]
    return lines


def render_precopy(result: Result, _ctx: Context) -> list[str]:
    summary = result["summary"]
    lines = [f"Workload: {summary['workload']}. Per direction (p50 over runs, slowest rank): an ordinary step, a "
             "step of the pre-copy (its extra over the ordinary one, and the pre-copy's own host work inside "
             "it), the handoff step that ends it and, beside them, the same switch made in one step; the KV "
             "each of those two steps still moves, and the steps the pre-copy paused for memory.", ""]
    rows = [[f"{r['src']}→{r['dst']}", ms(r["ordinary_p50_ms"]), ms(r["precopy_p50_ms"]),
             ms(r["precopy_extra_p50_ms"]), ms(r["precopy_host_p50_ms"]), ms(r["handoff_p50_ms"]),
             ms(r["one_step_p50_ms"]), _mib(r["handoff_kv_bytes"]), _mib(r["one_step_kv_bytes"]),
             str(r["paused_steps"]), str(r["runs"])] for r in summary["directions"]]
    return lines + table(["direction", "ordinary ms", "pre-copy step ms", "extra ms", "pre-copy host ms",
                          "handoff ms", "one-step switch ms", "handoff KV MiB", "one-step KV MiB", "paused",
                          "runs"], rows, "lrrrrrrrrrr") + [""]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.2f}"
