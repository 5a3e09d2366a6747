"""Rank-side work of ``bench/runtime_step.py``: equivalence in the compute format, the number of
layers that fit, and timed prefill/decode steps over synthetic histories.

Functions taking ``ctx`` run on every rank of a :class:`~splash_core.runtime.spawn.RankPool`
(they are module-level so they pickle); the rest are pure.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .. import dtypes, ownership
from ..interfaces import MLAKernels
from ..layouts import Layout
from ..profiles.loader import load
from ..profiles.model import ModelProfile
from .driver import Prompt, generate
from .kv_pool import held_pages
from .model import Model
from .reference_model import ReferenceModel
from .step_batch import StepBatch, StepRequest
from .weights import SeededWeights, tensor_shapes

GIB = 1 << 30


class RoundedWeights:
    """Seeded weights rounded to the compute format, so a float32 reference computes with exactly
    the weights the low-precision model holds and only the arithmetic differs."""

    def __init__(self, source, dtype: torch.dtype):
        self.source, self.dtype = source, dtype

    def get(self, name, shape, *, rows=None, cols=None, device=None, dtype=None):
        t = self.source.get(name, shape, rows=rows, cols=cols, device=device, dtype=self.dtype)
        return t.to(dtype or torch.float32)


def kernels_for(ctx, dtype: torch.dtype, which: str) -> MLAKernels:
    """The backend's MLA kernels, or (``which == 'reference'``) the torch reference on the rank's device."""
    if which == "reference":
        from ..reference import plugin

        return plugin.splash_mla_kernels(ctx.device, dtype)
    return ctx.backend.mla_kernels(ctx.device, dtype)


def _prompts(lengths, vocab: int, T: int, seed: int) -> list[Prompt]:
    """Prompts of the given lengths; owners unbalanced (every third on rank 0, the rest on T-1)."""
    rng = np.random.default_rng(seed)
    return [Prompt(i, 0 if i % 3 == 0 else T - 1, tuple(int(t) for t in rng.integers(0, vocab, n)))
            for i, n in enumerate(lengths)]


# ---- equivalence ------------------------------------------------------------------------

def check_equivalence(ctx, spec: dict) -> dict | None:
    """Each layout in ``spec['dtype']`` against a float32 reference on rank 0 (same rounded weights),
    teacher-forced with the reference's greedy tokens. Returns rank 0's metrics per layout.

    A layout passes when max |logit error| <= ``spec['tolerance']`` x max |reference logit| and every
    greedy token agrees except where the reference's top-2 margin is within twice that error."""
    profile = load("model", spec["model"])
    torch.set_float32_matmul_precision("highest")
    layers, dtype = spec["layers"], dtypes.torch_dtype(spec["dtype"])
    source = RoundedWeights(SeededWeights(spec["seed"]), dtype)
    prompts = _prompts(spec["prompts"], profile.vocab_size, ctx.world_size, spec["seed"])
    common = dict(T=ctx.world_size, page_size=spec["page_size"], chunk=spec["chunk"], new_tokens=spec["new_tokens"])
    forced = torch.zeros(len(prompts), spec["new_tokens"], dtype=torch.int64, device=ctx.device)
    ref = None
    if ctx.rank == 0:
        ref_model = ReferenceModel(profile, source, ctx.device, torch.float32, layers)
        ref = generate(ref_model.step, prompts, release=ref_model.release, **common)
        forced.copy_(torch.tensor([ref.tokens[p.id] for p in prompts]))
        del ref_model
    ctx.collectives.broadcast(forced, src=0)
    forced_tokens = {p.id: forced[i].tolist() for i, p in enumerate(prompts)}
    pages = sum(int(ownership.pages_for(len(p.tokens) + spec["new_tokens"], spec["page_size"])) for p in prompts)
    out = {}
    for name in spec["layouts"]:
        model = Model(rank=ctx.rank, T=ctx.world_size, device=ctx.device, collectives=ctx.collectives,
                      kernels=kernels_for(ctx, dtype, spec["kernels"]), profile=profile, source=source,
                      layouts=Layout(name), pages_per_layer=pages, page_size=spec["page_size"], dtype=dtype,
                      num_layers=layers)
        got = generate(model.step, prompts, release=model.release, forced=forced_tokens, **common)
        del model
        if ref is not None:
            out[name] = _compare(got, ref, spec["tolerance"])
    _release_cached_memory(ctx)
    return out if ctx.rank == 0 else None


def _release_cached_memory(ctx) -> None:
    """Hand cached device blocks back, so the next phase's free-memory reading is honest."""
    module = torch.get_device_module(ctx.device)
    if hasattr(module, "empty_cache"):
        module.empty_cache()


def _compare(got, ref, tolerance: float) -> dict:
    err = scale = 0.0
    mismatches = decisive = 0
    for (ids, a), (ref_ids, b) in zip(got.steps, ref.steps):
        assert ids == ref_ids, "teacher forcing keeps the step sequence"
        err, scale = max(err, float(np.abs(a - b).max())), max(scale, float(np.abs(b).max()))
    for (_, a), (_, b) in zip(got.steps, ref.steps):
        top2 = np.sort(b, axis=1)[:, -2:]
        differ = a.argmax(1) != b.argmax(1)
        mismatches += int(differ.sum())
        decisive += int((differ & (top2[:, 1] - top2[:, 0] > 2 * err)).sum())
    return {"max_abs_err": err, "ref_scale": scale, "rel_err": err / scale, "tolerance": tolerance,
            "greedy_mismatches": mismatches, "decisive_mismatches": decisive,
            "steps": len(got.steps), "passed": err <= tolerance * scale and decisive == 0}


# ---- memory planning --------------------------------------------------------------------

def describe_rank(ctx) -> dict:
    """Backend, device, hardware profile name and (free, total) memory of this rank."""
    return {"backend": ctx.backend.name, "device": str(ctx.device), "profile": ctx.backend.hardware_profile(),
            "memory": device_memory(ctx)}


def device_memory(ctx) -> tuple[int, int] | None:
    """(free, total) bytes of the rank's device, or None where torch cannot say (CPU)."""
    module = torch.get_device_module(ctx.device)
    if not hasattr(module, "mem_get_info") or ctx.device.type == "cpu":
        return None
    free, total = module.mem_get_info(ctx.device)
    return int(free), int(total)


def bytes_per_layer(profile: ModelProfile, layout: Layout, batch: ownership.Batch, T: int, page_size: int,
                    elem: int) -> int:
    """Busiest rank's bytes for one MLA layer + dense MLP shard in ``layout`` (ownership footprint plus
    what every layout holds: Q-A, KV-A, norms, indexer projection, 1/T of the MLP)."""
    fp = ownership.footprint(layout, batch, profile, T, page_size, layers=[0])
    shapes = tensor_shapes(profile, 1)
    small = sum(int(np.prod(s)) for n, s in shapes.items() if n.startswith("model.layers.0.")
                and not any(k in n for k in ("q_b_proj", "q_proj", "kv_b_proj", "o_proj", "mlp.")))
    mlp = 3 * profile.hidden_size * -(-profile.intermediate_size // T)
    return int((fp.weights + fp.kv + fp.indexer).max()) + (small + mlp) * elem


def layers_that_fit(profile: ModelProfile, T: int, batch: int, context: int, page_size: int, elem: int,
                    budget: float, prefill_chunk: int, margin_gib: float = 2.0) -> tuple[int, dict]:
    """Largest layer count (<= the model's) whose busiest layout fits ``budget`` bytes per rank at
    ``batch`` balanced requests of ``context`` tokens, keeping ``margin_gib`` free for activations and
    the allocator; with the accounting that decided it."""
    reqs = ownership.Batch.balanced(batch, context, T)
    per_layer = {str(l): bytes_per_layer(profile, l, reqs, T, page_size, elem) for l in Layout}
    fixed = (profile.vocab_size + -(-profile.vocab_size // T) + 1) * profile.hidden_size * elem
    # the reference kernel's scores/probabilities for one request's chunk, and fp32 weight generation
    transient = max(4 * prefill_chunk * profile.mla.heads * context * 4,
                    2 * profile.vocab_size * profile.hidden_size * 4) + int(margin_gib * GIB)
    worst = max(per_layer.values())
    fit = int(min(profile.num_layers, max(0, (budget - fixed - transient) // worst)))
    return fit, {"per_layer_bytes": per_layer, "fixed_bytes": fixed, "transient_bytes": transient,
                 "budget_bytes": int(budget)}


# ---- timed steps ------------------------------------------------------------------------

def _fill(model: Model, batch: StepBatch, context: int) -> None:
    """Give every request ``context`` tokens of history in every layer, by its layout's placement."""
    for layer in model.layers:
        for rid in list(layer.kv.requests):
            layer.kv.free(rid)
        for rid, owner in zip(batch.ids, batch.owners):
            pages = np.arange(int(ownership.pages_for(context, model.page_size)))
            layer.kv.alloc(int(rid), held_pages(layer.layout, int(rid), int(owner), pages, model.rank, model.T))


def _past_deadline(ctx, deadline: float) -> bool:
    """Rank 0's clock decides for everyone, so all ranks skip the same cases (no stray collective)."""
    flag = torch.tensor([float(time.time() > deadline)], device=ctx.device)
    ctx.collectives.broadcast(flag, src=0)
    return bool(flag.item())


def measure_layout(ctx, spec: dict) -> list[dict]:
    """Time one decode step and one prefill chunk per context in ``spec['layout']`` (only the
    phases in ``spec['phases']`` where given); rank-local wall times (device synchronised), one
    list of samples per rank."""
    profile = load("model", spec["model"])
    torch.set_float32_matmul_precision(spec["matmul_precision"])
    dtype, layout, T = dtypes.torch_dtype(spec["dtype"]), Layout(spec["layout"]), ctx.world_size
    B, ps, chunk = spec["batch"], spec["page_size"], spec["prefill_chunk"]
    owners = [i % T for i in range(B)]
    biggest = ownership.Batch.balanced(B, max(spec["contexts"]), T)
    pages = int(ownership.kv_pages_per_rank(layout, biggest, T, ps).max())
    model = Model(rank=ctx.rank, T=T, device=ctx.device, collectives=ctx.collectives,
                  kernels=kernels_for(ctx, dtype, spec["kernels"]), profile=profile,
                  source=SeededWeights(spec["seed"]), layouts=layout, pages_per_layer=pages, page_size=ps,
                  dtype=dtype, num_layers=spec["layers"])
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(spec["seed"])
    for layer in model.layers:  # synthetic history: unit-scale latents, as RMSNorm leaves them
        layer.kv.kv.normal_(generator=gen)
    samples = []
    for context in sorted(spec["contexts"]):
        for phase, rows in ((p, r) for p, r in (("decode", 1), ("prefill", chunk))
                            if p in spec.get("phases", ("decode", "prefill"))):
            if _past_deadline(ctx, spec["deadline"]):
                samples.append({"layout": str(layout), "phase": phase, "context": context, "skipped": "time budget"})
                continue
            batch = StepBatch.build([StepRequest(i, owners[i], context - rows, rows) for i in range(B)], T, ps)
            _fill(model, batch, context)
            tokens = torch.randint(0, profile.vocab_size, (batch.num_rows,), generator=gen, device=ctx.device)
            times = []
            for rep in range(spec["warmup"] + spec["reps"]):
                ctx.collectives.barrier()
                ctx.streams.synchronize()
                t0 = time.perf_counter()
                model.step(batch, tokens)  # rewrites the same slots: history stays `context` tokens
                ctx.streams.synchronize()
                if rep >= spec["warmup"]:
                    times.append((time.perf_counter() - t0) * 1e3)
            samples.append({"layout": str(layout), "phase": phase, "context": context, "batch": B,
                            "rows": batch.num_rows, "layers": len(model.layers), "step_ms": times})
    del model
    _release_cached_memory(ctx)
    return samples
