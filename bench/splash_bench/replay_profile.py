"""Rank-side profile of a replayed decode step (``bench/decode_step.py --profile``; issue 39): a few
replays under ``torch.profiler``, each one's kernels split into classes
(:mod:`.kernel_classes`), the median replay's split reported with each class's bytes and FLOPs.

On a device the profiler records device activity (kernels and copies; a captured graph's kernels
show on CUDA 12+ with torch 2.11); on the CPU, where nothing runs on a device, the outermost
operators of the host activity stand in, so ``--smoke`` runs the same code and writes the same keys.
"""

from __future__ import annotations

import statistics

from .kernel_classes import Kernel, breakdown, top_kernels, with_costs


def profiled_kernels(ctx, fn) -> list[Kernel]:
    """The kernels (device kernels, copies and sets; on the CPU its outermost operators) of one call of ``fn``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    on_device = ctx.device.type != "cpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    with profile(activities=activities) as prof:
        fn()
        ctx.streams.synchronize()
    events = prof.events()
    picked = ([e for e in events if e.device_type != DeviceType.CPU] if on_device
              else [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None])
    return [Kernel(e.name, float(e.time_range.start), float(e.time_range.elapsed_us())) for e in picked]


def profile_replays(ctx, fn, reps: int, replay_ms: float, costs: dict, rates: dict) -> dict:
    """``reps`` profiled calls of ``fn`` (a graph's replay): the split of the one whose kernels span
    the median time (:func:`~.kernel_classes.breakdown` over that span, with ``costs`` per class, and
    its 16 longest-running kernel names, ``top``), every call's span, and the time the event-timed replay (``replay_ms``) spends outside the span
    (launch and tail: the replay's time less its kernels' span). A profile that cannot be taken
    here (no kernels recorded, a profiler that fails to start) is ``{"error": why}``: the point's
    timings stand without it."""
    try:
        calls = [profiled_kernels(ctx, fn) for _ in range(max(1, reps))]
        splits = [breakdown(kernels) for kernels in calls]
    except (ValueError, RuntimeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    spans = [s["span_us"] for s in splits]
    middle = sorted(range(len(splits)), key=lambda i: splits[i]["span_us"])[len(splits) // 2]
    out = with_costs(splits[middle], costs, rates)
    out["top"] = top_kernels(calls[middle], 32)  # every kernel of a layer, not only the longest
    out.update(spans_us=spans, span_us_median=statistics.median(spans), replay_event_us=replay_ms * 1e3,
               outside_span_us=replay_ms * 1e3 - splits[middle]["span_us"], device=ctx.device.type != "cpu")
    return out


def profile_step(ctx, replay, eager, reps: int, replay_ms: float, costs: dict, rates: dict) -> dict:
    """:func:`profile_replays` of ``replay`` (``profiled``: graph); where no profile of the replay can
    be taken (its kernels not recorded), of the ``eager`` step instead (``profiled``: eager, with
    ``graph_error``): the same kernels by class, though its gaps are the host's launches."""
    got = profile_replays(ctx, replay, reps, replay_ms, costs, rates)
    if "error" not in got:
        return {**got, "profiled": "graph"}
    fallback = profile_replays(ctx, eager, reps, replay_ms, costs, rates)
    return fallback if "error" in fallback else {**fallback, "profiled": "eager", "graph_error": got["error"]}
