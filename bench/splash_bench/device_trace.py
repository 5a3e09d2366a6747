"""Rank-side work of ``bench/switch_trace.py``: where a switching step's device time goes.

The switch benchmark (:mod:`.bench`) measures how much longer a SPLASH step takes than the
target-ready one; this module says why, from a profiler trace of each. One ready and one SPLASH
step per direction (the switch benchmark's workload) run under ``torch.profiler``; from each
trace, :func:`timeline` takes the device kernels and reports

- per stream and kernel category (attention, merge, page copies, collectives, matmuls, other)
  the summed kernel time;
- for the compute stream (the one that runs attention): its span, busy time, and its idle
  gaps split by cause: ``host_idle_us`` where the kernel after the gap was launched only after
  the gap began (the device waited for the host), ``wait_idle_us`` where it was launched earlier
  (it waited for an event: a transfer, a collective);
- the compute kernels' time while another stream ran a kernel (``contended_us``) and how much
  longer attention and matmul kernels took then than their uncontended median.

``variants`` (all off by default) try changes to how the transfer shares the device, one per
pass, so one run compares them: ``priority`` (the side stream and the side communicator's
stream at high priority; ``ncclpriority``: only the latter, without copy engines), ``ctas=N``
(the side communicator limited to N CTAs), ``ce`` (the side communicator the backend makes
with ``transfer.copy_engines``: copy-engine all-gathers) and ``processors=N`` (attention
kernels sized for N processors), ``chunks=N`` (a layer's pages in at most N collectives, with
or without transfer buffers: ``transfer.max_chunks``, ``max_chunks_buffered``), ``noalign``
(transfers start as soon as the side stream is free: ``transfer.align_transfers`` off),
``nodefer`` (the first moving layer computes in the destination layout and moves first:
``transfer.defer_first`` off), ``pulls`` (KV pages pulled out of the peers' pools:
``transfer.peer_pulls``), or several joined by ``+``; each on top of the run's ``--transfer``
options. Each step is also run ``timed_runs`` times without the profiler (``untraced_ms``),
since profiling adds host time to every launch, with a :class:`~.layer_probe.LayerProbe` as the
executor's tracer (``layers``: per layer, the medians of its waits, compute and host time, and
how often the device had drained when the host reached it).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from splash_core.layouts import Layout
from splash_core.runtime.switch import Mode, SwitchExecutor

from . import switch as bench
from .layer_probe import LayerProbe, summarize
from .options import transfer_config

CATEGORIES = (("attention", ("_attention_kernel",)), ("merge", ("_merge_kernel",)), ("pages", ("_copy_pages",)),
              ("collective", ("nccl",)), ("matmul", ("gemm", "sm90", "cutlass", "nvjet", "xmma", "cublas")))
_KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def category(name: str) -> str:
    low = name.lower()
    return next((cat for cat, keys in CATEGORIES if any(k.lower() in low for k in keys)), "other")


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(a: float, b: float, covered: list[tuple[float, float]], starts: np.ndarray) -> float:
    """Length of [a, b) inside the union ``covered`` (sorted, disjoint; ``starts`` its starts)."""
    i, total = max(0, int(np.searchsorted(starts, a, side="right")) - 1), 0.0
    while i < len(covered) and covered[i][0] < b:
        total += max(0.0, min(b, covered[i][1]) - max(a, covered[i][0]))
        i += 1
    return total


def timeline(trace: dict) -> dict:
    """The summary described in the module docstring, from a Chrome trace (``traceEvents``) of
    one step. Times in microseconds; an empty dict when the trace has no device kernels."""
    events = trace.get("traceEvents", [])
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in _KERNEL_CATS]
    if not kernels:
        return {}
    launched = {e["args"]["correlation"]: float(e["ts"]) for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    streams: dict[int, dict[str, float]] = {}
    for k in kernels:
        per = streams.setdefault(int(k["args"].get("stream", -1)), {})
        cat = category(k["name"])
        per[cat] = per.get(cat, 0.0) + float(k["dur"])
    compute = max(streams, key=lambda s: (streams[s].get("attention", 0.0), sum(streams[s].values())))
    mine = sorted((k for k in kernels if int(k["args"].get("stream", -1)) == compute), key=lambda k: k["ts"])
    others = _union([(float(k["ts"]), float(k["ts"]) + float(k["dur"])) for k in kernels
                     if int(k["args"].get("stream", -1)) != compute])
    starts = np.array([a for a, _ in others])
    host_idle = wait_idle = 0.0
    for prev, nxt in zip(mine, mine[1:]):
        gap = float(nxt["ts"]) - (float(prev["ts"]) + float(prev["dur"]))
        if gap <= 0:
            continue
        launch = launched.get(nxt["args"].get("correlation"))
        if launch is not None and launch >= float(prev["ts"]) + float(prev["dur"]):
            host_idle += gap
        else:
            wait_idle += gap
    contended, alone = {}, {}
    for k in mine:
        a, d = float(k["ts"]), float(k["dur"])
        share = _overlap(a, a + d, others, starts) / d if d > 0 else 0.0
        (contended if share > 0.5 else alone).setdefault(category(k["name"]), []).append(d)
    slowdown = {}
    for cat in ("attention", "matmul"):
        if cat in contended and cat in alone:
            base = float(np.median(alone[cat]))
            slowdown[cat] = {"contended_kernels": len(contended[cat]), "contended_us": float(sum(contended[cat])),
                             "extra_us": float(sum(contended[cat]) - base * len(contended[cat])),
                             "median_alone_us": base, "median_contended_us": float(np.median(contended[cat]))}
    first, last = float(mine[0]["ts"]), max(float(k["ts"]) + float(k["dur"]) for k in mine)
    busy = sum(b - a for a, b in _union([(float(k["ts"]), float(k["ts"]) + float(k["dur"])) for k in mine]))
    return {"compute_stream": compute,
            "streams": {str(s): {c: round(v, 1) for c, v in sorted(per.items())} for s, per in streams.items()},
            "compute_span_us": last - first, "compute_busy_us": busy, "host_idle_us": host_idle,
            "wait_idle_us": wait_idle,
            "contended_us": sum(sum(v) for v in contended.values()), "slowdown": slowdown}


# ---- the rank side --------------------------------------------------------------------------

def _parts(variant: str) -> dict[str, str]:
    return dict((p.split("=") + [""])[:2] for p in variant.split("+") if p != "base")


def _variant_kernels(ctx, spec: dict, variant: str):
    """The backend's kernels, sized for fewer processors under ``processors=N``."""
    kernels = bench.kernels_for(ctx, bench.dtypes.torch_dtype(spec["dtype"]), spec["kernels"])
    processors = _parts(variant).get("processors")
    if not processors:
        return kernels
    from ...kernels import triton_mla_kernels

    config = kernels.decode.keywords["config"]
    return triton_mla_kernels(config.with_processors(int(processors)))


def variant_transfer(spec: dict, variant: str):
    """The run's transfer options (``spec['transfer']``) as ``variant`` changes them."""
    parts, base = _parts(variant), transfer_config(spec.get("transfer"))
    changes = {}
    if "noalign" in parts:
        changes["align_transfers"] = False
    if "nodefer" in parts:
        changes["defer_first"] = False
    if "pulls" in parts:
        changes["peer_pulls"] = True
    if "chunks" in parts:
        changes["max_chunks"] = changes["max_chunks_buffered"] = int(parts["chunks"])
    return dataclasses.replace(base, **changes)


def _apply_variant(ctx, executor: SwitchExecutor, variant: str) -> None:
    """Give the executor a side stream / communicator as ``variant`` says (accelerators only)."""
    parts = _parts(variant)
    if ctx.device.type == "cpu" or not ({"priority", "ncclpriority", "ctas", "ce"} & set(parts)):
        return
    import torch.distributed as dist

    if "ce" in parts:  # the backend's side communicator with copy engines
        transfer = dataclasses.replace(executor.transfer, copy_engines=True)
        options = ctx.backend.side_group_options(transfer)
    else:
        transfer, options = dataclasses.replace(executor.transfer, copy_engines=False), dist.ProcessGroupNCCL.Options()
    collectives = _side_group(ctx, options, parts, transfer)
    side = ctx.streams.new_stream()
    if "priority" in parts:
        side = torch.cuda.Stream(device=ctx.device, priority=-1)  # torch clamps to the highest
    executor.use_side(collectives, side)


def _side_group(ctx, options, parts: dict, transfer):
    """The variant's side communicator (``options`` adjusted by ``parts``) and its collectives."""
    import datetime

    import torch.distributed as dist

    if "priority" in parts or "ncclpriority" in parts:
        options.is_high_priority_stream = True
    if "ctas" in parts:
        options.config.max_ctas = int(parts["ctas"])
        options.config.min_ctas = 1
    group = dist.new_group(list(range(ctx.world_size)), backend="nccl", pg_options=options,
                           timeout=datetime.timedelta(seconds=ctx.timeout_s))
    return ctx.backend.collectives(group, ctx.device, side=True, transfer=transfer)


def _traced(ctx, fn) -> tuple[object, dict]:
    if ctx.device.type == "cpu":
        return fn(), {}
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        out = fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        trace = json.loads(Path(path).read_text())
    return out, trace


def trace_switches(ctx, spec: dict) -> list[dict]:
    """Per variant and direction, a ready and a SPLASH step traced: their step times, exposed
    waits and :func:`timeline` summaries. Rank 0 writes the raw traces of the first variant's
    directions under ``spec['trace_dir']`` (when given)."""
    out = []
    _traced(ctx, lambda: bench._quiet(ctx))  # the first profiled interval stalls (profiler set-up): not a step's
    for variant in spec["variants"]:
        kernels = _variant_kernels(ctx, spec, variant)
        transfer = variant_transfer(spec, variant)
        model = bench.build(ctx, {**spec, "transfer": dataclasses.asdict(transfer)}, spec["layers"], spec["context"],
                            kernels=kernels)
        probe = LayerProbe(ctx.streams)
        executor = SwitchExecutor(model, ctx, transfer=transfer, tracer=probe)
        try:  # fails alike on every rank, before any collective, where torch lacks an option
            _apply_variant(ctx, executor, variant)
        except (AttributeError, TypeError, ValueError) as exc:
            out.append({"variant": variant, "error": f"{type(exc).__name__}: {exc}"})
            continue
        batch = bench.synthetic_batch(spec["batch"], spec["context"], spec["rows"], ctx.world_size, spec["page_size"])
        bench.fill(model, batch)
        tokens = bench._tokens(ctx, model, batch)
        for src, dst in spec["directions"]:
            out += _trace_direction(ctx, spec, variant, executor, probe, batch, tokens,
                                    Layout.parse(src), Layout.parse(dst))
        del executor, model
        bench.release_cached_memory(ctx)
    return out


def _trace_direction(ctx, spec, variant, executor, probe, batch, tokens, src, dst) -> list[dict]:
    """A ready and a SPLASH step ``src`` → ``dst`` (see :func:`trace_switches`), one row each."""
    out = []
    executor.switch(batch, src)
    for _ in range(spec["warmup"]):  # compiles kernels, plans and caches the manifests
        executor.step(batch, tokens, dst, Mode.SPLASH)
        executor.switch(batch, src)
    untraced = {Mode.READY: [], Mode.SPLASH: []}
    probed = {mode: [] for mode in untraced}
    probe.take()  # the warm-up steps
    for _ in range(spec.get("timed_runs", 0)):
        for mode in untraced:
            bench._quiet(ctx)
            untraced[mode].append(executor.step(batch, tokens, dst, mode)[1].step_ms)
            probed[mode] += probe.take()
            executor.switch(batch, src)
    logits = {}
    probe.active = False  # the profiled steps carry no probe events
    for mode in (Mode.READY, Mode.SPLASH):
        if mode is Mode.READY:  # moved untraced, so the trace holds the step alone
            executor.switch(batch, dst)
        bench._quiet(ctx)
        (logits[mode], report), trace = _traced(ctx, lambda: executor.step(batch, tokens, dst, mode))
        row = {"variant": variant, "src": str(src), "dst": str(dst), "mode": str(mode),
               "step_ms": report.step_ms, "exposed_ms": report.exposed_ms, "host_ms": report.host_ms,
               "untraced_ms": untraced[mode], "layers": summarize(probed[mode]), "timeline": timeline(trace)}
        if mode is Mode.SPLASH:  # the state it moved computes what the ready state does
            row["max_abs_diff_vs_ready"] = float((logits[mode].float() - logits[Mode.READY].float())
                                                 .abs().max())
            row["deferred_layer"] = report.deferred_layer  # computed in its source layout: not bitwise ready's
            row["pulls"] = executor.io.peers is not None
        out.append(row)
        if trace and ctx.rank == 0 and spec.get("trace_dir") and variant == spec["variants"][0]:
            target = Path(spec["trace_dir"]) / f"trace-{src}-{dst}-{mode}.json.gz"
            target.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(target, "wt") as f:
                json.dump(trace, f)
        executor.switch(batch, src)
    probe.active = True
    return out
