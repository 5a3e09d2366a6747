"""Timed steps of a runtime model over synthetic histories: what ``splash calibrate`` measures
to fit the cost model's host term, and what the step benchmarks in ``bench/`` build on.

Every function taking ``ctx`` runs on every rank of a group (the same calls in the same order)
and is module-level, so it pickles into :class:`~splash_core.runtime.spawn.RankPool` workers.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import torch

from ..layouts import Layout
from ..model.ops import KERNELS
from ..model.weights import SeededWeights
from ..planning import ownership
from ..platform.interfaces import FusedKernels, GraphOps, MLAKernels
from ..profiles.graphs import GraphConfig
from ..profiles.model import ModelProfile
from .kv_pool import held_pages
from .model import Model
from .model_config import ModelConfig, RankOps
from .step_batch import StepBatch, StepRequest


def fill_histories(model: Model, batch: StepBatch, context: int) -> None:
    """Give every request ``context`` tokens of history in every paged layer, placed by the
    layer's layout (contents as they are)."""
    for layer in model.paged_layers:
        for rid in list(layer.kv.requests):
            layer.kv.free(rid)
        for rid, owner in zip(batch.ids, batch.owners):
            pages = np.arange(int(ownership.pages_for(context, model.page_size)))
            layer.kv.alloc(int(rid), held_pages(layer.layout, int(rid), int(owner), pages, model.rank, model.T))


def past_deadline(ctx, deadline: float) -> bool:
    """Whether rank 0's clock passed ``deadline``: rank 0 decides for everyone, so all ranks skip
    the same cases (no stray collective)."""
    flag = torch.tensor([float(time.time() > deadline)], device=ctx.device)
    ctx.collectives.broadcast(flag, src=0)
    return bool(flag.item())


def release_cached_memory(ctx) -> None:
    """Hand cached device blocks back, so the next phase's free-memory reading is honest."""
    module = torch.get_device_module(ctx.device)
    if hasattr(module, "empty_cache"):
        module.empty_cache()


GRAPH_MODES = ("auto", "on", "off")


def timing_graphs(ctx, mode: str) -> tuple[GraphConfig | None, GraphOps | None]:
    """What :func:`time_layout` replays decode steps with under ``mode``: ``auto`` the backend's
    graph ops where it captures (else none: eager), ``on`` the same but an error where it cannot,
    ``off`` none."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"graphs must be one of {', '.join(GRAPH_MODES)} (got {mode!r})")
    ops = None if mode == "off" else ctx.backend.graph_ops(ctx.device)
    if mode == "on" and ops is None:
        raise ValueError(f"graphs on: backend {ctx.backend.name} captures no graphs on {ctx.device}; "
                         f"use auto or off")
    return (None if ops is None else GraphConfig(mode="static")), ops


def step_path(model: Model, step: StepBatch) -> str:
    """How ``model`` ran ``step``: ``replay`` (a captured graph), ``static`` (the graph path's
    persistent buffers, run eagerly: the backend captures nothing) or ``eager``."""
    graphs = model.graphs
    key = None if graphs is None else graphs.key(step)
    if key is None:
        return "eager"
    if graphs.ops is None:
        return "static"
    return "replay" if key in graphs.graphs else "eager"  # a failed capture runs eagerly


def time_layout(ctx, *, profile: ModelProfile, layout: Layout, layers: int, batch: int, contexts,
                page_size: int, dtype: torch.dtype, kernels: MLAKernels, seed: int = 0, reps: int = 5,
                warmup: int = 2, prefill_chunk: int = 1, phases=("decode", "prefill"),
                deadline: float = float("inf"), fused: FusedKernels | None = None,
                graphs: GraphConfig | None = None, graph_ops: GraphOps | None = None) -> list[dict]:
    """Rank-local wall times (device synchronised) of one decode step and one ``prefill_chunk``-row
    prefill chunk per context in ``contexts`` (only ``phases``), ``reps`` after ``warmup``, for a
    model of ``layers`` layers in ``layout`` holding ``batch`` requests (owners round robin) of
    unit-scale synthetic histories. One dict per (context, phase): ``step_ms`` (this rank's
    samples) and ``path`` (how the step ran: ``replay`` of a captured graph, ``static`` buffers
    run eagerly, or ``eager``), or ``skipped`` once rank 0 passed ``deadline``.

    ``fused``: the small ops (None: the torch reference); ``graphs`` and ``graph_ops``: decode
    steps as the model's :class:`~splash_core.runtime.decode_graphs.DecodeGraphs` run them
    (None: eagerly). A decode step's first warm-up run captures its graph (so ``warmup`` >= 1
    keeps captures out of the timed runs); prefill always runs eagerly."""
    if graphs is not None and warmup < 1:
        raise ValueError("timing decode graphs needs warmup >= 1 (the first run captures)")
    T = ctx.world_size
    owners = [i % T for i in range(batch)]
    biggest = ownership.Batch.balanced(batch, max(contexts), T)
    pages = int(ownership.kv_pages_per_rank(layout, biggest, T, page_size).max())
    config = ModelConfig(profile, layout, pages_per_layer=pages, page_size=page_size, dtype=dtype, num_layers=layers,
                         graphs=graphs)
    ops = RankOps(ctx.rank, T, ctx.device, ctx.collectives, kernels, fused=fused or KERNELS,
                  graph_ops=graph_ops, streams=ctx.streams)
    model = Model(config, ops, SeededWeights(seed))
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(seed)
    for layer in model.paged_layers:  # synthetic history: unit-scale latents, as RMSNorm leaves them
        layer.kv.kv.normal_(generator=gen)
    samples = []
    for context in sorted(contexts):
        for phase, rows in ((p, r) for p, r in (("decode", 1), ("prefill", prefill_chunk)) if p in phases):
            if past_deadline(ctx, deadline):
                samples.append({"layout": str(layout), "phase": phase, "context": context, "skipped": "time budget"})
                continue
            step = StepBatch.build([StepRequest(i, owners[i], context - rows, rows) for i in range(batch)], T,
                                   page_size)
            fill_histories(model, step, context)
            tokens = torch.randint(0, profile.vocab_size, (step.num_rows,), generator=gen, device=ctx.device)
            times = []
            for rep in range(warmup + reps):
                ctx.collectives.barrier()
                ctx.streams.synchronize()
                t0 = time.perf_counter()
                model.step(step, tokens)  # rewrites the same slots: history stays `context` tokens
                ctx.streams.synchronize()
                if rep >= warmup:
                    times.append((time.perf_counter() - t0) * 1e3)
            samples.append({"layout": str(layout), "phase": phase, "context": context, "batch": batch,
                            "rows": step.num_rows, "layers": len(model.layers), "step_ms": times,
                            "path": step_path(model, step)})
    del model
    gc.collect()  # a model's decode graphs and tables hold each other (and its KV pool): free them before the next
    release_cached_memory(ctx)
    return samples
