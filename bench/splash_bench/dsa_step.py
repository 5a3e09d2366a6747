"""Rank-side work of ``bench/dsa_step.py``: a decode step and a prefill chunk of a DeepSeek-V3.2
shaped model, attending densely and sparsely (DeepSeek Sparse Attention through the backend's
Triton kernels, and through FlashMLA's sparse kernels where the Hopper backend has them), beside
the roofline of the bytes and FLOPs each step must touch, measured in the same run.

Functions taking ``ctx`` run on the rank of a :class:`~splash_core.runtime.spawn.RankPool`.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from splash_core import dtypes
from splash_core.checkpoint.seeded_fp8 import SeededFP8Weights
from splash_core.layouts import Layout
from splash_core.model.fp8_cache import quantize
from splash_core.model.weights import SeededWeights
from splash_core.planning import ownership
from splash_core.planning.attention_forms import MLADims, expanded_requests, pair_flops
from splash_core.profiles.graphs import GraphConfig
from splash_core.profiles.loader import load
from splash_core.runtime.model import Model
from splash_core.runtime.model_config import ModelConfig, RankOps, fp8_kernels_for
from splash_core.runtime.step_batch import StepBatch, StepRequest
from splash_core.runtime.step_timing import fill_histories, past_deadline, release_cached_memory

from .decode_step import device_rates, weight_parts
from .kernel_classes import breakdown, top_kernels, with_costs
from .kernels import kernels_for
from .replay_profile import profiled_kernels

CACHE_FORMATS = {"bf16": (None, 0), "fp8": (torch.float8_e4m3fn, 4)}  # kv_dtype (None: compute), scales


def providers(ctx, dtype: torch.dtype, which: str, asked: list[str] = ()) -> dict:
    """Sparse-attention kernel variants to time (name -> MLAKernels), each the backend's kernels
    with another sparse attention: ``triton``, the portable Triton path whatever provider table
    the backend reads (else FlashMLA, once chosen, would be timed against itself); FlashMLA's where
    the Hopper backend's wrapper imports; ``triton-direct`` where ``asked``: the Triton kernel
    reading a scaled-fp8 cache in prefill too (no bf16 copy). On the CPU: the reference alone."""
    base = kernels_for(ctx, dtype, which)
    name = base.name.split(":")[0].split("+")[0]  # "triton" on a GPU backend, "reference" on the CPU
    out = {name: base}
    if name == "triton":
        from splash_core.kernels import dsa_attention, dsa_dequantized

        base = out[name] = dataclasses.replace(
            base, sparse=dsa_dequantized.prefill_on_dequantized(dsa_attention.sparse_attention))
        if "triton-direct" in asked:
            out["triton-direct"] = dataclasses.replace(base, sparse=dsa_attention.sparse_attention)
    try:
        from splash_backend_hopper import flashmla
    except ImportError:
        return out
    if flashmla.missing_reason() is None and base.sparse is not None:
        try:
            out["flashmla"] = dataclasses.replace(base, sparse=flashmla.sparse(base.sparse))
        except Exception as exc:  # noqa: BLE001 - a wheel that does not load here is a finding, not a failure
            print(f"FlashMLA's sparse kernels are not available here: {type(exc).__name__}: {exc}", flush=True)
    return out


def build(ctx, spec: dict, cache: str, sparse: bool, context: int, kernels) -> Model:
    """``spec['layers']`` layers of the model in TP at T = 1 with pages for ``spec['batch']``
    requests at ``context``, seeded weights (the feed-forward ones kept FP8 where
    ``spec['ffn_weights']`` says so) and synthetic unit-scale histories (indexer keys too)."""
    profile, dtype = load("model", spec["model"]), dtypes.torch_dtype(spec["dtype"])
    batch = ownership.Batch.balanced(spec["batch"], context, 1)
    pages = int(ownership.kv_pages_per_rank(Layout.TP, batch, 1, spec["page_size"]).max())
    kv_dtype, scales = CACHE_FORMATS[cache]
    graphs = GraphConfig() if spec.get("graphs") else None
    fp8 = spec.get("ffn_weights") == "fp8"
    config = ModelConfig(profile, Layout.TP, pages_per_layer=pages, page_size=spec["page_size"], dtype=dtype,
                         kv_dtype=kv_dtype, kv_scales=scales, num_layers=spec["layers"], sparse_attention=sparse,
                         attention_form=spec["prefill_form"], graphs=graphs, fp8_ffn=fp8)
    ops = RankOps(ctx.rank, 1, ctx.device, ctx.collectives, kernels, fused=ctx.backend.fused_kernels(ctx.device, dtype),
                  streams=ctx.streams, graph_ops=ctx.backend.graph_ops(ctx.device) if graphs else None,
                  fp8_kernels=fp8_kernels_for(ctx.backend, ctx.device, dtype) if fp8 else None)
    model = Model(config, ops, (SeededFP8Weights if fp8 else SeededWeights)(spec["seed"]))
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(spec["seed"])
    for layer in model.paged_layers:
        fmt = layer.kv.format
        for pages_of, layout in ((layer.kv.kv, fmt.scaled), (layer.kv.indexer, fmt.indexer_scaled)):
            if pages_of is not None:
                _fill(pages_of, layout, gen)
    return model


def _fill(pages: torch.Tensor, layout, gen, chunk: int = 1 << 18) -> None:
    """Unit-normal entries (as RMSNorm leaves latents), quantized where the pages hold the
    scaled-fp8 format, ``chunk`` tokens at a time."""
    if layout is None:
        pages.normal_(generator=gen)
        return
    flat = pages.view(-1, pages.shape[-1])
    width = layout.latent_dim + layout.rope_dim
    for start in range(0, flat.shape[0], chunk):
        rows = flat[start: start + chunk]
        values = torch.randn(rows.shape[0], width, generator=gen, device=pages.device)
        rows.copy_(quantize(values, layout))


def roofline(model: Model, rows: int, batch: int, context: int, sparse: bool, rates: dict) -> dict:
    """Bytes and FLOPs the step must touch: weights once (the embedding's rows only), each
    request's cache entries it attends to (all ``context``, or the indexer's top-k) and, sparse,
    every indexer key; projections (every row through the layers' weights, kv_b's included, the LM
    head on each request's last row; those through FP8-kept weights at the measured FP8 rate where
    there is one), indexer scores and attention FLOPs (dense: causal pairs in the form the rows
    attend in); and the same per profiled kernel class (``class_costs``: attention, gemm, lm_head)."""
    weights = weight_parts(model)
    weight_bytes, head = weights["bytes"], weights["head_params"]
    layers, profile, m = len(model.paged_layers), model.profile, model.math
    kv = model.paged_layers[0].kv
    entry_bytes = kv.kv.shape[2] * kv.kv.element_size()
    attended = min(context, profile.indexer.topk) if sparse else context
    kv_bytes = batch * attended * entry_bytes * layers
    index_bytes = (batch * context * kv.indexer.shape[2] * kv.indexer.element_size() * layers) if sparse else 0
    heads, idx = profile.mla.heads, profile.indexer
    if sparse:  # each row over its selected keys, absorbed
        attention_flops = 2 * rows * heads * attended * (m.kv_width + m.d_c) * layers
    else:  # causal, in the form the rows attend in (kv_b's work is the gemm class's: per row, through the weights)
        dims = MLADims.of(profile.mla)
        per_request = [rows // batch] * batch, [context] * batch
        absorbed, expanded = pair_flops(dims, *per_request)
        form = np.where(expanded_requests(model.config.attention_form, dims, *per_request), expanded, absorbed)
        attention_flops = int(form.sum()) * heads * layers
    index_flops = 2 * rows * idx.heads * idx.head_dim * context * layers if sparse else 0
    head_flops = 2 * batch * head
    gemm_flops = 2 * rows * (weights["compute_params"] - head)
    fp8_flops = 2 * rows * weights["fp8_params"]
    memory_ms = (weight_bytes + kv_bytes + index_bytes) / (rates["copy_gbps"] * 1e6)
    compute_ms = ((attention_flops + index_flops + gemm_flops + head_flops) / (rates["matmul_tflops"] * 1e9)
                  + fp8_flops / ((rates.get("fp8_matmul_tflops") or rates["matmul_tflops"]) * 1e9))
    costs = {"attention": {"bytes": int(kv_bytes + index_bytes), "flops": int(attention_flops + index_flops)},
             "gemm": {"bytes": int(weight_bytes - weights["head_bytes"]), "flops": int(gemm_flops),
                      "fp8_flops": int(fp8_flops)},
             "lm_head": {"bytes": weights["head_bytes"], "flops": int(head_flops)}}
    return {"weight_bytes": int(weight_bytes), "kv_bytes": int(kv_bytes), "index_bytes": int(index_bytes),
            "attention_flops": int(attention_flops), "index_flops": int(index_flops),
            "projection_flops": int(gemm_flops + head_flops + fp8_flops), "fp8_flops": int(fp8_flops),
            "memory_ms": memory_ms, "compute_ms": compute_ms, "roofline_ms": max(memory_ms, compute_ms),
            "class_costs": costs}


def _steps(spec: dict, context: int) -> dict:
    """The decode step (B rows at the last position) and the prefill chunk (``chunk_rows`` new
    rows per request, ending at ``context``)."""
    B, r = spec["batch"], spec["chunk_rows"]
    return {"decode": StepBatch.build([StepRequest(i, 0, context - 1, 1) for i in range(B)], 1, spec["page_size"]),
            "prefill": StepBatch.build([StepRequest(i, 0, context - r, r) for i in range(B)], 1, spec["page_size"])}


def _timed_steps(ctx, model: Model, step: StepBatch, tokens, history: int, reps: int) -> tuple[list[float], object]:
    """Host milliseconds (start to device done) of ``reps`` calls of the step after one warm-up
    (which captures a decode step's graph where the model has graphs), a prefill chunk each on a
    history of ``history`` tokens laid out afresh (it opens pages: run twice on one history it
    would find them taken), a decode step on one (it rewrites its own slot); and the last call's logits."""
    out, logits = [], None
    for rep in range(reps + 1):
        if rep == 0 or not step.is_decode:
            fill_histories(model, step, history)
        ctx.streams.synchronize()
        t0 = time.perf_counter()
        logits = model.step(step, tokens)
        ctx.streams.synchronize()
        if rep:
            out.append((time.perf_counter() - t0) * 1e3)
    return out, logits


def time_model(ctx, model: Model, spec: dict, context: int, variant: dict, rates: dict) -> list[dict]:
    """Samples of the decode step and prefill chunk of ``model`` at ``context`` (and their logits)."""
    out = []
    for phase, step in _steps(spec, context).items():
        rows = int(sum(step.rows))
        gen = torch.Generator(device=ctx.device)
        gen.manual_seed(spec["seed"] + context)
        tokens = torch.randint(0, model.profile.vocab_size, (rows,), generator=gen, device=ctx.device)
        history = context if phase == "decode" else context - spec["chunk_rows"]  # the tokens before the step
        wall, logits = _timed_steps(ctx, model, step, tokens, history,
                                    spec["reps"] if phase == "decode" else spec["prefill_reps"])
        logits = logits.float()
        out.append({**variant, "phase": phase, "context": context, "batch": spec["batch"], "rows": rows,
                    "layers": len(model.paged_layers), "wall_ms": wall, "finite": bool(torch.isfinite(logits).all()),
                    "logits": logits[-spec["batch"]:].cpu(),
                    **roofline(model, rows, spec["batch"], context, variant["sparse"], rates)})
        if model.graphs is not None and phase == "decode":
            out[-1]["replayed"] = model.graphs.key(step) in model.graphs.graphs
        if spec.get("profile"):
            out[-1]["profile"] = profile_step(ctx, model, step, tokens, history, out[-1]["class_costs"], rates)
    return out


def profile_step(ctx, model: Model, step: StepBatch, tokens, history: int, costs: dict, rates: dict) -> dict:
    """One more call of the step under the profiler: its kernels by class, each beside its floor
    from ``costs`` (:func:`roofline`'s class costs), and the longest-running names (``{"error"}``
    where no profile can be taken here)."""
    fill_histories(model, step, history)
    ctx.streams.synchronize()
    try:
        kernels = profiled_kernels(ctx, lambda: model.step(step, tokens))
        return {**with_costs(breakdown(kernels), costs, rates), "top": top_kernels(kernels, 32)}
    except (ValueError, RuntimeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _agreement(samples: list[dict], base: str) -> None:
    """Each sparse provider's logits against the ``base`` provider's (Triton's on a GPU) at the same
    point (same weights and keys): the largest difference and whether the greedy tokens agree; the
    logits leave the samples."""
    triton = {(s["cache"], s["phase"], s["context"]): s["logits"] for s in samples if s["provider"] == base}
    for s in samples:
        want = triton.get((s["cache"], s["phase"], s["context"]))
        logits = s.pop("logits")
        if s["sparse"] and want is not None and s["provider"] != base:
            s["max_logit_diff_vs_triton"] = float((logits - want).abs().max())
            s["tokens_match_triton"] = bool(torch.equal(logits.argmax(-1), want.argmax(-1)))


def measure(ctx, spec: dict) -> dict:
    """Every (cache format, context, dense / sparse provider) of ``spec`` until rank 0 passes the
    deadline: the device's rates, then the samples (one model per cache format, context and mode)."""
    dtype = dtypes.torch_dtype(spec["dtype"])
    torch.set_float32_matmul_precision("high")
    rates = device_rates(ctx, spec["copy_mib"], spec["matmul_n"], dtype, fp8=spec.get("ffn_weights") == "fp8")
    found = providers(ctx, dtype, spec["kernels"], spec["providers"])
    first = next(iter(found))  # the backend's own: built into every model, and what the others are compared with
    variants = {name: k for name, k in found.items() if name == first or not spec["providers"] or name in spec["providers"]}
    samples, skipped = [], []
    modes = (False, True) if load("model", spec["model"]).indexer is not None else (False,)  # sparse or not
    for cache in spec["caches"]:
        for context in spec["contexts"]:
            for sparse in modes:
                if past_deadline(ctx, spec["deadline"]):
                    skipped.append(f"{cache}/{context}/{'sparse' if sparse else 'dense'}")
                    continue
                t0 = time.perf_counter()
                model = build(ctx, spec, cache, sparse, context, found[first])
                built = time.perf_counter() - t0
                for name, kernels in (variants.items() if sparse else [("dense", found[first])]):
                    model.kernels = kernels
                    variant = {"cache": cache, "sparse": sparse, "provider": name, "build_s": built}
                    try:
                        samples += time_model(ctx, model, spec, context, variant, rates)
                    except Exception as exc:  # noqa: BLE001 - a provider refusing a shape is a finding
                        where = traceback.extract_tb(exc.__traceback__)[-1]
                        samples.append({**variant, "context": context, "error": f"{type(exc).__name__}: {exc} "
                                        f"(at {Path(where.filename).name}:{where.lineno})"})
                del model
                gc.collect()
                release_cached_memory(ctx)
    _agreement([s for s in samples if "logits" in s], next(iter(variants)))
    return {"rates": rates, "samples": samples, "skipped": skipped}
