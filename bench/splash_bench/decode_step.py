"""Rank-side work of ``bench/decode_step.py``: one decode step at T = 1, eager against replayed
from its captured graph, per batch size and context, beside its roofline in the same run.

Functions taking ``ctx`` run on the rank of a :class:`~splash_core.runtime.spawn.RankPool`
(module-level, so they pickle). Times come from the rank's own streams and events
(``ctx.streams``), so the same code runs on the CPU reference (``--smoke``) and on a GPU.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from splash_core import dtypes
from splash_core.checkpoint.seeded_fp8 import SeededFP8Weights
from splash_core.layouts import Layout
from splash_core.model import ops as reference_fused
from splash_core.model.weights import SeededWeights
from splash_core.planning import ownership
from splash_core.profiles.graphs import GraphConfig
from splash_core.profiles.loader import load
from splash_core.runtime.model import Model
from splash_core.runtime.model_config import ModelConfig, RankOps, fp8_kernels_for
from splash_core.runtime.step_batch import StepBatch, StepRequest
from splash_core.runtime.step_timing import fill_histories, past_deadline, release_cached_memory

from .kernels import kernels_for
from .replay_profile import profile_step

MIB = 1 << 20


def _timed(ctx, fn, reps: int) -> list[float]:
    """Device milliseconds of each of ``reps`` calls of ``fn`` (events around each call)."""
    out = []
    for _ in range(reps):
        start, end = ctx.streams.new_event(timing=True), ctx.streams.new_event(timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def device_rates(ctx, copy_mib: int, matmul_n: int, dtype: torch.dtype, reps: int = 5, fp8: bool = False) -> dict:
    """The copy bandwidth (bytes read + written per second, device to device) and the dense
    matrix-multiply rate of ``dtype``, measured here: the roofline's ceilings. ``fp8``: also the
    FP8 matmul rate (``fp8_matmul_tflops``: e4m3 operands, per-tensor scales) where the device has
    one: the ceiling of GEMMs against weights kept FP8."""
    src = torch.empty(copy_mib * MIB, dtype=torch.uint8, device=ctx.device).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_ms = statistics.median(_timed(ctx, lambda: dst.copy_(src), reps))
    a = torch.randn(matmul_n, matmul_n, device=ctx.device).to(dtype)
    b = torch.randn(matmul_n, matmul_n, device=ctx.device).to(dtype)
    a @ b
    mm_ms = statistics.median(_timed(ctx, lambda: a @ b, reps))
    rates = {"copy_gbps": 2 * copy_mib * MIB / copy_ms / 1e6, "matmul_tflops": 2 * matmul_n ** 3 / mm_ms / 1e9,
             "copy_mib": copy_mib, "matmul_n": matmul_n}
    if fp8 and ctx.device.type == "cuda":
        try:
            a8, one = a.to(torch.float8_e4m3fn), torch.ones((), device=ctx.device)
            b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major: what cuBLAS's FP8 GEMM takes

            def fp8_mm():
                return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

            fp8_mm()
            rates["fp8_matmul_tflops"] = 2 * matmul_n ** 3 / statistics.median(_timed(ctx, fp8_mm, reps)) / 1e9
        except (RuntimeError, AttributeError):  # no FP8 matmul here: FP8 GEMMs are held to the matmul rate
            pass
    return rates


def build(ctx, spec: dict, batch: int) -> Model:
    """The timing model: ``spec['layers'][batch]`` layers in ``spec['layout']`` with pages for
    ``batch`` requests at the longest context, the backend's fused ops and graph ops, and
    unit-scale synthetic histories (as RMSNorm leaves latents)."""
    profile, dtype = load("model", spec["model"]), dtypes.torch_dtype(spec["dtype"])
    layout = Layout(spec["layout"])
    biggest = ownership.Batch.balanced(batch, max(spec["contexts"]), ctx.world_size)
    pages = int(ownership.kv_pages_per_rank(layout, biggest, ctx.world_size, spec["page_size"]).max())
    graph_ops = ctx.backend.graph_ops(ctx.device)
    fp8 = spec.get("ffn_weights") == "fp8"
    config = ModelConfig(profile, layout, pages_per_layer=pages, page_size=spec["page_size"], dtype=dtype,
                         num_layers=spec["layers"][str(batch)],
                         graphs=GraphConfig(mode="static", min_table_pages=spec["min_table_pages"]), fp8_ffn=fp8)
    fp8_kernels = fp8_kernels_for(ctx.backend, ctx.device, dtype) if fp8 else None
    ops = RankOps(ctx.rank, ctx.world_size, ctx.device, ctx.collectives, kernels_for(ctx, dtype, spec["kernels"]),
                  fused=ctx.backend.fused_kernels(ctx.device, dtype), graph_ops=graph_ops, streams=ctx.streams,
                  fp8_kernels=fp8_kernels)
    model = Model(config, ops, (SeededFP8Weights if fp8 else SeededWeights)(spec["seed"]))
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(spec["seed"])
    for layer in model.paged_layers:
        layer.kv.kv.normal_(generator=gen)
    return model


def _use_unfused(model: Model, unfused: bool, backend_fused) -> None:
    """The model's small ops: the backend's fused kernels, or the torch ops of before issue 22."""
    fused = reference_fused.KERNELS if unfused else backend_fused
    model.fused = model.math.fused = fused
    for mlp in model.mlps:
        if mlp is not None:
            mlp.silu_mul = fused.silu_mul


def weight_parts(model: Model) -> dict:
    """The weights a step reads once (all but the embedding, of which it reads a few rows): their
    ``bytes``, their parameters held in the compute dtype (``compute_params``) and kept FP8
    (``fp8_params``, about one byte each with their block scales), and the LM head's share of them
    (``head_params``, ``head_bytes``)."""
    held = model.nbytes()
    size = model.embed.element_size()
    weight_bytes = held["weights"] + held["mlp"] + held["experts"] + held["other"] - model.embed.numel() * size
    kept_fp8 = held["mlp"] + held["experts"] if model.config.fp8_ffn else 0
    head = model.lm_head.numel()
    return {"bytes": int(weight_bytes), "compute_params": int((weight_bytes - kept_fp8) // size),
            "fp8_params": int(kept_fp8), "head_params": int(head),
            "head_bytes": int(head * model.lm_head.element_size())}


def roofline(model: Model, batch: int, context: int, rates: dict) -> dict:
    """What the step must move and compute: every weight it reads once (all but the embedding,
    of which it reads B rows) and every request's KV history in every layer, at the measured
    copy bandwidth; the projections' and attention's FLOPs at the measured matmul rate."""
    weights = weight_parts(model)
    weight_bytes = weights["bytes"]
    m = model.math
    heads = model.profile.mla.heads
    layers = len(model.paged_layers)
    kv_bytes = batch * context * m.kv_width * model.paged_layers[0].kv.kv.element_size() * layers
    attention_flops = 2 * batch * heads * context * (m.kv_width + m.d_c) * layers  # scores, then values
    projection_flops = 2 * batch * (weights["compute_params"] + weights["fp8_params"])
    memory_ms = (weight_bytes + kv_bytes) / (rates["copy_gbps"] * 1e6)
    compute_ms = (attention_flops + projection_flops) / (rates["matmul_tflops"] * 1e9)
    head = weights["head_params"]  # its GEMM is the profile's lm_head class, the other weights' its gemm class
    head_bytes, head_flops = weights["head_bytes"], 2 * batch * head
    costs = {"attention": {"bytes": int(kv_bytes), "flops": int(attention_flops)},
             "gemm": {"bytes": int(weight_bytes - head_bytes), "flops": int(projection_flops - head_flops)},
             "lm_head": {"bytes": int(head_bytes), "flops": int(head_flops)}}
    return {"weight_bytes": int(weight_bytes), "kv_bytes": int(kv_bytes), "attention_flops": int(attention_flops),
            "projection_flops": int(projection_flops), "memory_ms": memory_ms, "compute_ms": compute_ms,
            "roofline_ms": max(memory_ms, compute_ms), "class_costs": costs}


def _profiled_device_ms(ctx, fn) -> float | None:
    """Device time of the kernels one call of ``fn`` launches (the profiler's sum), or None
    where no device profiler runs (the host, or a machine without one)."""
    if ctx.device.type == "cpu":
        return None
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            ctx.streams.synchronize()
        device = [e for e in prof.events() if e.device_type != DeviceType.CPU]  # kernels and copies
        return sum(e.time_range.elapsed_us() for e in device) / 1e3 if device else None
    except Exception:  # noqa: BLE001 - a profiler that cannot start here: the replay's time stands alone
        return None


def _wall(ctx, fn, warmup: int, reps: int) -> list[float]:
    """Host milliseconds of each call of ``fn`` from its start to the device being done."""
    out = []
    for rep in range(warmup + reps):
        ctx.streams.synchronize()
        t0 = time.perf_counter()
        fn()
        ctx.streams.synchronize()
        if rep >= warmup:
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def time_point(ctx, model: Model, batch: int, context: int, spec: dict, rates: dict, backend_fused) -> list[dict]:
    """Samples of one (batch, context): eager (fused, and unfused as before), graph replay
    (whole step, and the replay alone), with the capture's time and memory and the roofline."""
    T, page = ctx.world_size, spec["page_size"]
    step = StepBatch.build([StepRequest(i, i % T, context - 1, 1) for i in range(batch)], T, page)
    fill_histories(model, step, context)
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(spec["seed"] + context)
    tokens = torch.randint(0, model.profile.vocab_size, (batch,), generator=gen, device=ctx.device)
    common = {"batch": batch, "context": context, "layers": len(model.layers), "layout": spec["layout"]}
    graphs, samples = model.graphs, []
    model.graphs = None  # eager: the model's plain step (it rewrites the same slots: the history stays)
    eager = {}
    for variant, unfused in (("eager", False), ("eager_unfused", True)):
        if unfused and not spec["unfused"]:
            continue
        _use_unfused(model, unfused, backend_fused)
        wall = _wall(ctx, lambda: model.step(step, tokens), spec["warmup"], spec["reps"])
        eager[variant] = model.step(step, tokens)
        samples.append({**common, "path": variant, "wall_ms": wall,
                        "device_ms": _profiled_device_ms(ctx, lambda: model.step(step, tokens))})
    _use_unfused(model, False, backend_fused)
    model.graphs = graphs
    captures = len(graphs.captures)
    logits = model.step(step, tokens)  # captures the graph of this bucket (tables widened for this context)
    fresh = graphs.captures[captures:]
    wall = _wall(ctx, lambda: model.step(step, tokens), spec["warmup"], spec["reps"])
    key = graphs.key(step)
    graph = graphs.graphs.get(key)
    if graph is None:  # the capture failed: the steps ran eagerly, and the reason is kept
        samples.append({**common, "path": "graph", "wall_ms": wall, "captured": False,
                        "failed": graphs.failed.get(key, "not captured"), **agreement(logits, eager["eager"])})
        samples.append({**common, "path": "roofline", **roofline(model, batch, context, rates)})
        return samples
    replay = _timed(ctx, graph.replay, spec["reps"])
    limit = roofline(model, batch, context, rates)
    profiled = {}
    if spec.get("profile"):  # where the replay's time goes, beside what its classes must move and compute
        profiled["profile"] = profile_step(ctx, graph.replay, lambda: _eager_step(model, step, tokens),
                                           spec["profile_reps"], statistics.median(replay), limit["class_costs"], rates)
    samples.append({**common, "path": "graph", "wall_ms": wall, "replay_ms": replay,
                    "captured": graph.captured is not None, "capture_s": float(sum(c["seconds"] for c in fresh)),
                    "graph_bytes": int(sum(c["bytes"] for c in fresh)), "table_width": graphs.tables.width,
                    **agreement(logits, eager["eager"]), **profiled})
    samples.append({**common, "path": "roofline", **limit})
    return samples


def _eager_step(model: Model, step: StepBatch, tokens: torch.Tensor) -> None:
    """The model's plain step without its graphs (it rewrites the same KV slots as the replay)."""
    graphs, model.graphs = model.graphs, None
    try:
        model.step(step, tokens)
    finally:
        model.graphs = graphs


def agreement(got: torch.Tensor, want: torch.Tensor) -> dict:
    """How the graph's logits [R, V] agree with the eager step's: the largest difference, the
    eager logits' scale, and the greedy tokens that differ, all and decisive ones (where the
    eager step's top-2 margin exceeds twice that difference: not a near tie)."""
    diff = float((got - want).abs().max())
    top2 = want.topk(2, dim=-1).values
    differ = got.argmax(-1) != want.argmax(-1)
    decisive = differ & (top2[:, 0] - top2[:, 1] > 2 * diff)
    return {"tokens_match": not bool(differ.any()), "mismatches": int(differ.sum()),
            "decisive_mismatches": int(decisive.sum()), "max_logit_diff": diff,
            "logit_scale": float(want.abs().max())}


def measure(ctx, spec: dict) -> dict:
    """Every (batch, context) of ``spec`` until rank 0 passes ``spec['deadline']``: the device's
    rates, then the samples (one model per batch size, its layers sized to fit)."""
    dtype = dtypes.torch_dtype(spec["dtype"])
    torch.set_float32_matmul_precision("high")
    rates = device_rates(ctx, spec["copy_mib"], spec["matmul_n"], dtype)
    backend_fused = ctx.backend.fused_kernels(ctx.device, dtype)
    samples, skipped = [], []
    for batch in spec["batches"]:
        if past_deadline(ctx, spec["deadline"]):
            skipped += [f"B={batch}/{c}" for c in spec["contexts"]]
            continue
        t0 = time.perf_counter()
        model = build(ctx, spec, batch)
        built_s = time.perf_counter() - t0
        for context in sorted(spec["contexts"]):
            if past_deadline(ctx, spec["deadline"]):
                skipped.append(f"B={batch}/{context}")
                continue
            samples += [{**s, "build_s": built_s} for s in time_point(ctx, model, batch, context, spec, rates,
                                                                      backend_fused)]
        del model
        gc.collect()  # the model and its graphs may hold each other: free both before the next one is built
        release_cached_memory(ctx)
    return {"rates": rates, "samples": samples, "skipped": skipped}
