"""Where a replayed step's device time goes (issue 39): its kernels, by name, in named classes.

:func:`kernel_class` puts a kernel (on the CPU, an outermost operator) into one of :data:`CLASSES`
by substrings of its name, the first class that matches winning; what none matches is ``other``
(its names are kept, so a new kernel shows instead of hiding). The LM head is a GEMM like the
projections, told apart by place: the step's last GEMM (after the final norm; argmax or sampling
follow it). :func:`breakdown` sums one step's kernels per class, with each class's share of the
step's time and the idle gap between kernels: the step's time less the time some kernel ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# (class, name substrings), matched in this order on the lower-cased name; routing_topk: MoE routing, top-k, sorts
CLASSES = (
    ("memcpy", ("memcpy", "memset", "_copy_pages")),
    ("collective", ("nccl", "allreduce", "all_reduce", "allgather", "all_gather", "reducescatter", "c10d::")),
    ("attention", ("_attention_kernel", "_sparse_kernel", "_merge_kernel", "_expanded_kernel", "_indexer_kernel",
                   "flash_mla", "mla", "flash_fwd", "flashattn", "fmha", "attention", "sdpa", "cudnn")),
    ("routing_topk", ("topk", "sort", "radix", "devicescan", "histogram", "moe", "expert", "route", "bincount",
                     "cumsum")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "sm80_", "splitkreduce", "aten::mm", "aten::addmm",
              "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::einsum")),
    ("elementwise", ("norm", "rms", "rope", "rotary", "elementwise", "silu", "reduce", "index", "cat", "copy", "fill",
                     "_latent", "_token_groups", "softmax", "argmax", "gather", "scatter", "where", "triton",
                     "aten::")),
)
# every class reported
NAMES = ("attention", "gemm", "lm_head", "routing_topk", "elementwise", "memcpy", "collective", "other")


@dataclass(frozen=True)
class Kernel:
    """One kernel (on the CPU, an outermost operator) of a step: its name, start and duration in microseconds."""

    name: str
    start_us: float
    duration_us: float


def kernel_class(name: str) -> str:
    """The class of a kernel named ``name``: the first of :data:`CLASSES` one of whose substrings it
    contains, else ``other``."""
    low = name.lower()
    return next((cls for cls, keys in CLASSES if any(k in low for k in keys)), "other")


def classes_of(kernels: list[Kernel]) -> list[str]:
    """Each kernel's class (``kernels`` in launch order), the step's last GEMM being the LM head's,
    with the GEMM before it where the last one is its split-K reduction."""
    classes = [kernel_class(k.name) for k in kernels]
    gemms = [i for i, c in enumerate(classes) if c == "gemm"]
    for n, i in enumerate(reversed(gemms)):
        classes[i] = "lm_head"
        if n or "splitkreduce" not in kernels[i].name.lower():
            break
    return classes


def busy_us(kernels: list[Kernel]) -> float:
    """Microseconds some kernel ran (overlapping kernels counted once)."""
    total, end = 0.0, -math.inf
    for k in sorted(kernels, key=lambda k: k.start_us):
        stop = k.start_us + k.duration_us
        if stop > end:
            total += stop - max(k.start_us, end)
            end = stop
    return total


def breakdown(kernels: list[Kernel], step_us: float | None = None) -> dict:
    """One step's device time per class: microseconds, kernels and share of the step's time
    (``step_us``, e.g. the replay's event time; default the span from the first kernel's start to
    the last one's end), the idle gap (step time less busy time) and the unmatched names.

    ValueError for no kernels, a duration or start that is not a finite non-negative number, or a
    step time shorter than the time kernels ran (the breakdown would claim negative idle time)."""
    if not kernels:
        raise ValueError("no kernels in the profiled step (was the profiler's device activity on?)")
    for k in kernels:
        if not (math.isfinite(k.duration_us) and math.isfinite(k.start_us) and k.duration_us >= 0):
            raise ValueError(f"kernel {k.name!r}: start {k.start_us} / duration {k.duration_us} us is not a time")
    busy = busy_us(kernels)
    span = max(k.start_us + k.duration_us for k in kernels) - min(k.start_us for k in kernels)
    step = span if step_us is None else float(step_us)
    if not (math.isfinite(step) and step > 0) or busy > step * 1.001:
        raise ValueError(f"step time {step} us is not a positive time covering the {busy:.1f} us kernels ran")
    per = {name: {"us": 0.0, "kernels": 0} for name in NAMES}
    unmatched: dict[str, float] = {}
    kernels = sorted(kernels, key=lambda k: k.start_us)
    for k, cls in zip(kernels, classes_of(kernels)):
        per[cls]["us"] += k.duration_us
        per[cls]["kernels"] += 1
        if cls == "other":
            unmatched[k.name] = unmatched.get(k.name, 0.0) + k.duration_us
    for entry in per.values():
        entry["share"] = entry["us"] / step
    idle = max(0.0, step - busy)
    top = sorted(unmatched.items(), key=lambda kv: -kv[1])[:8]
    return {"classes": per, "step_us": step, "span_us": span, "busy_us": busy, "idle_gap_us": idle,
            "idle_share": idle / step, "kernels": len(kernels), "unmatched": [{"name": n, "us": us} for n, us in top]}


def with_costs(split: dict, costs: dict, rates: dict) -> dict:
    """``split`` (:func:`breakdown`) with, for each class in ``costs`` ({class: {"bytes", "flops",
    "fp8_flops"}}), its bytes and FLOPs, its floor (the longer of bytes at the measured copy rate and
    FLOPs at the measured matmul rate, those through FP8-kept weights, ``fp8_flops``, at the measured
    FP8 rate where there is one, as the run's physical limit counts them) and its time over that floor;
    and the step's ``serial_floor_us``, the sum of those floors (its kernels run one after another, so
    no class's FLOPs hide behind another's bytes), with ``over_serial_floor``, the step's time over it."""
    out = {**split, "classes": {k: dict(v) for k, v in split["classes"].items()}}
    fp8_tflops = rates.get("fp8_matmul_tflops") or rates["matmul_tflops"]
    for cls, cost in costs.items():
        entry = out["classes"][cls]
        floor_us = max(cost.get("bytes", 0) / (rates["copy_gbps"] * 1e3),
                       cost.get("flops", 0) / (rates["matmul_tflops"] * 1e6)
                       + cost.get("fp8_flops", 0) / (fp8_tflops * 1e6))
        entry.update(bytes=int(cost.get("bytes", 0)), flops=int(cost.get("flops", 0)), floor_us=floor_us,
                     over_floor=entry["us"] / floor_us if floor_us > 0 else None)
        if cost.get("fp8_flops"):
            entry["fp8_flops"] = int(cost["fp8_flops"])
    # one kernel after another: each class at its own floor, the compute-bound ones (attention at
    # 128 heads on a fast memory) no longer hidden behind the others' bytes as the step's roofline hides them
    out["serial_floor_us"] = sum(out["classes"][cls]["floor_us"] for cls in costs)
    out["over_serial_floor"] = out["step_us"] / out["serial_floor_us"] if out["serial_floor_us"] > 0 else None
    return out


def top_kernels(kernels: list[Kernel], count: int = 10) -> list[dict]:
    """The ``count`` kernel names that ran longest in all (``{"name", "us", "calls"}``, longest first)."""
    totals: dict[str, list] = {}
    for k in kernels:
        entry = totals.setdefault(k.name, [0.0, 0])
        entry[0] += k.duration_us
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:count]
    return [{"name": name, "us": us, "calls": calls} for name, (us, calls) in ranked]
