"""Rank-side work of ``bench/runtime_step.py``: equivalence in the compute format, the number of
layers that fit, and timed prefill/decode steps over synthetic histories
(:func:`splash_core.runtime.step_timing.time_layout`).

Functions taking ``ctx`` run on every rank of a :class:`~splash_core.runtime.spawn.RankPool`
(they are module-level so they pickle); the rest are pure.
"""

from __future__ import annotations

import numpy as np
import torch

from splash_bench.driver import Prompt, generate
from splash_core import dtypes
from splash_core.layouts import Layout
from splash_core.model.weights import RoundedWeights, SeededWeights, tensor_shapes
from splash_core.planning import ownership
from splash_core.profiles.loader import load
from splash_core.profiles.model import ModelProfile
from splash_core.runtime.model import Model
from splash_core.runtime.model_config import ModelConfig, RankOps
from splash_core.runtime.reference_model import ReferenceModel
from splash_core.runtime.step_timing import release_cached_memory, time_layout, timing_graphs

from .kernels import kernels_for
from .platform_name import accelerator_platform

GIB = 1 << 30


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
        config = ModelConfig(profile, Layout(name), pages_per_layer=pages, page_size=spec["page_size"], dtype=dtype,
                             num_layers=layers)
        model = Model(config, RankOps(ctx.rank, ctx.world_size, ctx.device, ctx.collectives,
                                      kernels_for(ctx, dtype, spec["kernels"])), source)
        got = generate(model.step, prompts, release=model.release, forced=forced_tokens, **common)
        del model
        if ref is not None:
            out[name] = _compare(got, ref, spec["tolerance"])
    release_cached_memory(ctx)
    return out if ctx.rank == 0 else None


def _compare(got, ref, tolerance: float) -> dict:
    err = scale = 0.0
    mismatches = decisive = 0
    for (ids, a), (ref_ids, b) in zip(got.steps, ref.steps):
        assert ids == ref_ids, "teacher forcing keeps the step sequence"
        # np.maximum keeps a NaN (Python's max(0.0, nan) drops it, and NaN logits would pass)
        err, scale = float(np.maximum(err, np.abs(a - b).max())), float(np.maximum(scale, np.abs(b).max()))
    for (_, a), (_, b) in zip(got.steps, ref.steps):
        top2 = np.sort(b, axis=1)[:, -2:]
        differ = a.argmax(1) != b.argmax(1)
        mismatches += int(differ.sum())
        decisive += int((differ & (top2[:, 1] - top2[:, 0] > 2 * err)).sum())
    assert len(got.steps) == len(ref.steps), "teacher forcing keeps the step count"  # zip would drop the rest
    return {"max_abs_err": err, "ref_scale": scale, "rel_err": err / scale if scale else float("nan"),
            "tolerance": tolerance, "greedy_mismatches": mismatches, "decisive_mismatches": decisive,
            "steps": len(got.steps), "passed": len(got.steps) > 0 and err <= tolerance * scale and decisive == 0}


# ---- memory planning --------------------------------------------------------------------

def add_memory_options(parser, *, margin_gib: float) -> None:
    """The flags of the layer sizing (:func:`layers_that_fit`) the step benchmarks share."""
    parser.add_argument("--max-layers", type=int, default=0, help="cap on the layers that fit (0: no cap)")
    parser.add_argument("--memory-fraction", type=float, default=0.85, help="share of free device memory to plan with")
    parser.add_argument("--margin-gib", type=float, default=margin_gib,
                        help="memory kept free for activations (and graphs) and the allocator")
    parser.add_argument("--cpu-budget-gib", type=float, default=2.0, help="memory to plan with where the device cannot say")


def describe_rank(ctx) -> dict:
    """Backend, device, hardware profile name and (free, total) memory of this rank."""
    return {"backend": ctx.backend.name, "device": str(ctx.device), "profile": ctx.backend.hardware_profile(),
            "memory": device_memory(ctx)}


def add_one_device_options(p) -> None:
    """The options every one-device benchmark shares, read back by :func:`one_device_platform`."""
    p.add_argument("--out", default="bench/results", help="results root; files go to <out>/<platform>/")
    p.add_argument("--backend", default="auto", help="backend plugin (auto: the accelerator's, else reference)")
    p.add_argument("--kernels", choices=("backend", "reference"), default="backend", help="MLA attention kernels")
    p.add_argument("--platform", default=None, help="results folder (default: the backend's hardware profile)")


def one_device_platform(args, pool) -> tuple[dict, str]:
    """(rank 0's :func:`describe_rank`, the results folder) of a one-device benchmark: ``--platform``,
    else the accelerator's name (an H100 run is never filed under the backend's h200 profile), else
    the backend's hardware profile, else cpu; exits where ``--backend auto`` found no accelerator and
    the run is no ``--smoke``."""
    info = pool.run(describe_rank)[0]
    if args.backend == "auto" and info["device"] == "cpu" and not args.smoke:
        raise SystemExit("backend auto found no accelerator backend; install one (pip install --no-deps -e "
                         "backends/cuda -e backends/hopper) or pass --smoke")
    named = accelerator_platform(default="") if info["device"] != "cpu" else ""
    return info, args.platform or named or info["profile"] or "cpu"


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

def measure_layout(ctx, spec: dict) -> list[dict]:
    """Time one decode step and one prefill chunk per context in ``spec['layout']`` (only the
    phases in ``spec['phases']`` where given), with the backend's fused ops and decode graphs as
    ``spec['graphs']`` says (:func:`~splash_core.runtime.step_timing.timing_graphs`; off where
    absent); rank-local wall times (device synchronised), one list of samples per rank."""
    torch.set_float32_matmul_precision(spec["matmul_precision"])
    dtype = dtypes.torch_dtype(spec["dtype"])
    graphs, graph_ops = timing_graphs(ctx, spec.get("graphs", "off"))
    return time_layout(ctx, profile=load("model", spec["model"]), layout=Layout(spec["layout"]),
                       layers=spec["layers"], batch=spec["batch"], contexts=spec["contexts"],
                       page_size=spec["page_size"], dtype=dtype, kernels=kernels_for(ctx, dtype, spec["kernels"]),
                       seed=spec["seed"], reps=spec["reps"], warmup=spec["warmup"],
                       prefill_chunk=spec["prefill_chunk"], phases=spec.get("phases", ("decode", "prefill")),
                       deadline=spec["deadline"], fused=ctx.backend.fused_kernels(ctx.device, dtype),
                       graphs=graphs, graph_ops=graph_ops)
