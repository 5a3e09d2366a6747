"""Measure θ on this machine and write it as a hardware profile (paper §4.2).

:func:`measure` runs on every rank of a group and is device-neutral: it times work with the
backend's StreamOps events and talks through the backend's Collectives, so it measures the
paths SPLASH itself uses. A backend may answer ``splash_calibrate`` itself (and usually
calls :func:`measure` and adds what only it can read, such as device memory).
:func:`build_profile` turns rank 0's numbers into a hardware profile mapping where every
number it measured is ``measured`` with date, machine and command; the entries it did not
measure keep the base profile's value and provenance. The runtime part of θ (t0 and the
host overheads per layout) is timed and fitted by :mod:`splash_core.studies.calibrate_runtime`.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import yaml

from ..profiles import loader
from ..profiles.hardware import HardwareProfile

GB = 1e9
MIB = 1 << 20
COLLECTIVE_OPS = ("all_gather", "all_to_all", "all_reduce")
GRAPH_KEYS = ("graph_step_overhead_us", "graph_layer_overhead_us")  # replayed decode steps' part of θ
# What a profile gets for numbers no microbenchmark gives when there is no base profile.
UNMEASURED_DEFAULTS = {
    "step_overhead_us": {"value": 100.0, "source": "assumed",
                         "ref": "no base profile: typical scheduler + launch overhead per step"},
}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big and how often: accelerators get sizes that saturate them, the host small ones."""

    matmul_n: int
    weight_bytes: int
    kv_requests: int
    kv_tokens: int
    kv_heads: int
    collective_bytes: tuple[int, ...]
    repeats: int
    # prefill attention: requests x chunk rows at the end of kv_tokens-token histories (as many rows
    # per request as the runtime timing's prefill chunks: the extend kernel's rate depends on it), heads
    chunk_rows: int = 0
    attention_heads: int = 0
    # kernel calls timed back to back per sample: a call of a fraction of a millisecond is shorter
    # than the host's work to issue it, and replayed graphs run kernels at their device rate
    burst: int = 1

    @classmethod
    def choose(cls, accelerator: bool, quick: bool) -> "Sizes":
        if accelerator:
            return cls(8192, (256 if quick else 1024) * MIB, 16, 8192 if quick else 32768, 16,
                       (4096, 1 * MIB, 16 * MIB, 64 * MIB) if quick
                       else (4096, 256 * 1024, 4 * MIB, 32 * MIB, 256 * MIB), 5 if quick else 10,
                       chunk_rows=16, attention_heads=128, burst=20)
        return cls(256 if quick else 512, (16 if quick else 64) * MIB, 2, 512 if quick else 2048, 4,
                   (4096, 256 * 1024, 2 * MIB) if quick else (4096, 64 * 1024, 1 * MIB, 8 * MIB),
                   3 if quick else 5, chunk_rows=16, attention_heads=8)


def describe(sizes: Sizes, dtype: torch.dtype) -> dict[str, str]:
    """What each measured key means, written into the profile's ``ref`` fields."""
    name = str(dtype).replace("torch.", "")
    calls = f"median per call of {sizes.repeats} bursts of {sizes.burst} back-to-back calls"
    kv_mib = sizes.kv_requests * sizes.kv_tokens * 576 * torch.finfo(dtype).bits // 8 / MIB
    return {
        "matmul_tflops": f"{name} {sizes.matmul_n}^3 matmul, median of {sizes.repeats}",
        "weight_read_gbps": f"8-row {name} matmul streaming a {sizes.weight_bytes // MIB} MiB weight, median",
        "kv_read_gbps": (f"backend MLA decode, {sizes.kv_requests} requests x {sizes.kv_tokens} tokens, "
                         f"{sizes.kv_heads} heads, d_c 512 + d_r 64 ({kv_mib:.0f} MiB {name} cache), {calls}"),
        "attention_tflops": (f"backend MLA extend (prefill attention), {sizes.kv_requests} requests x "
                             f"{sizes.chunk_rows} rows at the end of {sizes.kv_tokens}-token histories, "
                             f"{sizes.attention_heads} heads, causal FLOPs 2 x heads x (576 + 512) per visible "
                             f"key, {name}, {calls}"),
        "decode_attention_tflops": (f"backend MLA decode, {sizes.kv_requests} requests x {sizes.kv_tokens} tokens, "
                                    f"{sizes.attention_heads} heads, FLOPs 2 x heads x (576 + 512) per key, {name}, {calls}"),
        "all_gather_gbps": "least-squares fit of all-gather time vs bytes received per rank (collective_samples)",
        "all_to_all_gbps": "least-squares fit of even all-to-all time vs bytes received per rank",
        "all_reduce_gbps": "least-squares fit of all-reduce time vs bytes reduced per rank",
        "collective_latency_us": "median time of the smallest all-gather, all-to-all and all-reduce",
        "memory_gib": "total memory the device reports",
    }


def timed(fn: Callable[[], Any], streams, repeats: int, warmup: int = 1, before: Callable[[], Any] = None) -> list[float]:
    """Seconds of each of ``repeats`` runs of ``fn``, timed by the backend's events."""
    for _ in range(warmup):
        fn()
    streams.synchronize()
    samples = []
    for _ in range(repeats):
        if before is not None:
            before()
        start, end = streams.new_event(timing=True), streams.new_event(timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return samples


def per_call(fn: Callable[[], Any], streams, sizes: "Sizes") -> float:
    """Median seconds of one call of ``fn`` over ``sizes.repeats`` bursts of ``sizes.burst`` calls."""
    def burst():
        for _ in range(sizes.burst):
            fn()
    return statistics.median(timed(burst, streams, sizes.repeats)) / sizes.burst


def _matmul_tflops(device, dtype, sizes: Sizes, streams) -> float:
    n = sizes.matmul_n
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = statistics.median(timed(lambda: torch.matmul(a, b, out=out), streams, sizes.repeats))
    return 2 * n**3 / seconds / 1e12


def _weight_read_gbps(device, dtype, sizes: Sizes, streams) -> float:
    elem = torch.finfo(dtype).bits // 8
    k = 4096
    weight = torch.randn(k, sizes.weight_bytes // (k * elem), device=device).to(dtype)
    x = torch.randn(8, k, device=device).to(dtype)
    seconds = statistics.median(timed(lambda: x @ weight, streams, sizes.repeats))
    return weight.numel() * elem / seconds / GB


def _kv_read_gbps(device, dtype, sizes: Sizes, streams, kernels) -> float:
    page, d_c, d_r = 64, 512, 64
    pages_per_req = sizes.kv_tokens // page
    cache = torch.randn(sizes.kv_requests * pages_per_req, page, d_c + d_r, device=device).to(dtype)
    table = torch.arange(cache.shape[0], device=device, dtype=torch.int32).view(sizes.kv_requests, -1)
    index = torch.arange(pages_per_req, device=device, dtype=torch.int32).expand_as(table).contiguous()
    q = torch.randn(sizes.kv_requests, sizes.kv_heads, d_c + d_r, device=device).to(dtype)
    rows = torch.arange(sizes.kv_requests, device=device, dtype=torch.int32)
    pos = torch.full_like(rows, sizes.kv_tokens - 1)
    seconds = per_call(lambda: kernels.decode(q, cache, table, index, rows, pos, (d_c + d_r) ** -0.5, d_c),
                       streams, sizes)
    return cache.numel() * cache.element_size() / seconds / GB


def _attention_tflops(device, dtype, sizes: Sizes, streams, kernels) -> tuple[float, float]:
    """Attention's rates with the model's heads, FLOPs counted as the cost model counts them (per
    (row, key) pair, causal): the backend's extend kernel on chunks of rows at the end of paged
    histories (prefill), and its decode kernel on one row per request (decode, whose time is
    mostly the KV read it shares with kv_read_gbps; the rate then says so to Eq 10's max)."""
    page, d_c, d_r = 64, 512, 64
    rows, context, heads = sizes.chunk_rows, sizes.kv_tokens, sizes.attention_heads
    pages_per_req = context // page
    cache = torch.randn(sizes.kv_requests * pages_per_req, page, d_c + d_r, device=device).to(dtype)
    table = torch.arange(cache.shape[0], device=device, dtype=torch.int32).view(sizes.kv_requests, -1)
    index = torch.arange(pages_per_req, device=device, dtype=torch.int32).expand_as(table).contiguous()
    scale, pair_flops = (d_c + d_r) ** -0.5, 2 * heads * (d_c + d_r + d_c)
    q = torch.randn(sizes.kv_requests * rows, heads, d_c + d_r, device=device).to(dtype)
    row_req = torch.arange(sizes.kv_requests, device=device, dtype=torch.int32).repeat_interleave(rows)
    row_pos = (context - rows + torch.arange(rows, device=device, dtype=torch.int32)).repeat(sizes.kv_requests)
    prefill_s = per_call(lambda: kernels.extend(q, cache, table, index, row_req, row_pos, scale, d_c), streams, sizes)
    q1 = torch.randn(sizes.kv_requests, heads, d_c + d_r, device=device).to(dtype)
    req = torch.arange(sizes.kv_requests, device=device, dtype=torch.int32)
    pos = torch.full_like(req, context - 1)
    decode_s = per_call(lambda: kernels.decode(q1, cache, table, index, req, pos, scale, d_c), streams, sizes)
    prefill_pairs = sizes.kv_requests * (rows * context - rows * (rows - 1) // 2)
    return (prefill_pairs * pair_flops / prefill_s / 1e12,
            sizes.kv_requests * context * pair_flops / decode_s / 1e12)


def collective_samples(collectives, device, sizes: Sizes, streams) -> list[dict]:
    """Per op and size, the slowest rank's median time (a collective ends on its last rank)."""
    size = collectives.size
    samples = []
    for total in sizes.collective_bytes:
        chunk = max(1, total // (4 * size))  # float32 elements each rank contributes
        inp = torch.randn(chunk * size, device=device)
        out = torch.empty_like(inp)
        ops = {
            "all_gather": (lambda: collectives.all_gather_into(out, inp[:chunk]), chunk * (size - 1) * 4),
            "all_to_all": (lambda: collectives.all_to_all(out, inp, [chunk] * size, [chunk] * size),
                           chunk * (size - 1) * 4),
            "all_reduce": (lambda: collectives.all_reduce(inp), inp.numel() * 4),
        }
        for op, (fn, received) in ops.items():
            mine = statistics.median(timed(fn, streams, sizes.repeats, before=collectives.barrier))
            slowest = max(collectives.all_gather_object(mine))
            samples.append({"op": op, "ranks": size, "bytes": int(received), "seconds": slowest})
    return samples


def fit_collectives(samples: list[dict]) -> dict[str, float]:
    """Bandwidth per op from a least-squares line through (bytes, seconds), and the latency
    as the median time of the smallest messages."""
    theta = {}
    smallest = []
    for op in COLLECTIVE_OPS:
        points = sorted((s["bytes"], s["seconds"]) for s in samples if s["op"] == op)
        if not points:
            continue
        smallest.append(points[0][1])
        xs, ys = zip(*points)
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
        if slope <= 0:  # noise swamped the sizes: fall back to the largest message alone
            slope = points[-1][1] / points[-1][0]
        theta[f"{op}_gbps"] = 1 / slope / GB
    if smallest:
        theta["collective_latency_us"] = statistics.median(smallest) * 1e6
    return theta


def measure(collectives, device, streams, kernels, options: dict) -> dict:
    """θ measured on this rank (collective numbers agreed across the group): the dict
    ``splash_calibrate`` returns, plus ``methods`` (key -> how it was measured, for the
    profile's ``ref``). Collective keys are absent on a group of one rank.

    ``options``: ``quick`` (fewer sizes and repeats) and ``dtype`` (torch dtype of the
    matmul, weight and KV measurements; float32 if absent)."""
    dtype = options.get("dtype", torch.float32)
    sizes = Sizes.choose(device.type != "cpu", bool(options.get("quick")))
    theta: dict[str, Any] = {
        "matmul_tflops": _matmul_tflops(device, dtype, sizes, streams),
        "weight_read_gbps": _weight_read_gbps(device, dtype, sizes, streams),
        "kv_read_gbps": _kv_read_gbps(device, dtype, sizes, streams, kernels),
    }
    theta["attention_tflops"], theta["decode_attention_tflops"] = _attention_tflops(device, dtype, sizes, streams,
                                                                                    kernels)
    if collectives.size > 1:
        samples = collective_samples(collectives, device, sizes, streams)
        theta.update(fit_collectives(samples))
        theta["collective_samples"] = samples
    theta["methods"] = describe(sizes, dtype)
    return theta


def calibrate_rank(ctx, options: dict) -> dict:
    """What ``splash calibrate`` runs on every rank: the backend's own calibration, else
    :func:`measure` with the backend's streams and MLA kernels."""
    theta = ctx.backend.calibrate(ctx.collectives, ctx.device, options)
    if theta is None:
        kernels = ctx.backend.mla_kernels(ctx.device, options.get("dtype", torch.float32))
        theta = measure(ctx.collectives, ctx.device, ctx.streams, kernels, options)
    return theta


def build_profile(theta: dict, base: HardwareProfile | None, *, name: str, machine: str, command: str,
                  backend: str, date: str | None = None) -> dict:
    """A hardware profile mapping: measured keys from ``theta``, the rest from ``base``."""
    date = date or datetime.date.today().isoformat()
    methods = theta.get("methods", {})
    data: dict[str, Any] = {"kind": "hardware", "name": name,
                            "platform": base.platform if base else backend,
                            "device": base.device if base else machine}

    def measured(key: str, value: float) -> dict:
        return {"value": round(float(value), 4), "source": "measured",
                "ref": methods.get(key, f"splash_calibrate of backend {backend}"),
                "date": date, "machine": machine, "command": command}

    kept = _fill_entries(data, theta, base, measured)
    data["collective_samples"] = [dict(s, seconds=float(f"{s['seconds']:.6g}")) for s in theta.get("collective_samples", ())]
    _add_step_samples(data, theta, base, kept)
    note = f"Calibrated by `{command}` on {machine} ({date})."
    if kept:
        note += f" Kept from the base profile {base.name!r}: {', '.join(kept)}."
    data["notes"] = note
    return data


def _fill_entries(data: dict, theta: dict, base: HardwareProfile | None,
                  measured: Callable[[str, float], dict]) -> list[str]:
    """Put every profile key into ``data``: measured, kept from ``base``, or a default; the kept keys."""
    kept = []
    for field in dataclasses.fields(HardwareProfile):
        key = field.name
        if key in ("name", "platform", "device", "notes") or key.endswith("_samples"):
            continue
        optional = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        kept_value = getattr(base, key) if base is not None else None
        if key in GRAPH_KEYS and "layer_overhead_us" in theta:  # timed again, eagerly: the base's replay is stale
            kept_value = None
        if key in theta:
            value = theta[key]
            data[key] = ({layout: measured(key, v) for layout, v in value.items()} if isinstance(value, dict)
                         else measured(key, value))
        elif kept_value:  # present in the base (an optional key may be absent or empty there)
            data[key] = _as_yaml(kept_value)
            kept.append(key)
        elif key in UNMEASURED_DEFAULTS:
            data[key] = dict(UNMEASURED_DEFAULTS[key])
        elif not optional:
            raise ValueError(f"calibration measured no {key} and there is no base profile to keep it "
                             f"from; pass --base PROFILE")
    return kept


def _add_step_samples(data: dict, theta: dict, base: HardwareProfile | None, kept: list[str]) -> None:
    if theta.get("step_samples"):
        data["step_samples"] = [dict(s, seconds=float(f"{s['seconds']:.6g}")) for s in theta["step_samples"]]
    elif "layer_overhead_us" in kept and base.step_samples:  # the samples the kept overheads were fitted to
        data["step_samples"] = [{**dataclasses.asdict(s), "layout": str(s.layout)} for s in base.step_samples]


def _as_yaml(value: Any) -> Any:
    """A profile entry kept from the base, as YAML data (a Quantity, or a mapping of them)."""
    if isinstance(value, Mapping):
        return {str(k): _as_yaml(v) for k, v in value.items()}
    return {k: v for k, v in dataclasses.asdict(value).items() if v != ""}


def write_profile(data: dict, path: str | Path) -> HardwareProfile:
    """Validate ``data`` as a hardware profile, then write it as YAML."""
    profile = loader.from_mapping("hardware", data, file=str(path))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # One line per number (flow style), as the hand-written profiles are laid out.
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=4096))
    return profile
