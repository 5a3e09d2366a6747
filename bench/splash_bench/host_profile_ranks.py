"""Rank-side work of ``bench/runtime_host_profile.py``: where the host time of one step goes.

It uses only the runtime's public API (``Model`` with its ``before_layer`` hook, ``StepBatch``,
``LayerKV``), so the same code measures any checkout of the project, the one before a change
included (``--baseline-tree``): whichever ``splash_core`` the ranks were started with.

One layout per call: a model with DeepSeek-V3's structure (Q-LoRA, absorbed MLA, dense MLP,
vocabulary-parallel head) at tiny widths, B requests with long histories (many pages each),
and three step kinds:

- ``decode``: one row per request, no page opens (``bench/runtime_step.py``'s decode step);
- ``decode_open``: one row per request and one request opens a page in every layer, as in
  serving, where every few steps some request crosses a page boundary (the opened page is
  freed again between repetitions, outside the timing);
- ``prefill``: ``chunk`` rows per request.

A fresh :class:`StepBatch` is built for every repetition (as the engine does each step), so
nothing computed lazily on a batch survives from one step to the next.

Per repetition and rank: the step's wall time and each layer's CPU time (attention + MLP,
taken at ``Model.step``'s ``before_layer`` marks), with the time spent inside the attention
kernels (``decode``/``extend``/``merge``) and inside the collectives measured apart: the
runtime's own host time of a layer is the rest. One more, untimed, step counts per layer the
torch operations the runtime issues outside kernels and collectives (kernel launches and views
on an accelerator), the host arrays turned into tensors (host-to-device copies there) and the
reads of tensor values on the host (``item``, ``tolist``, ``cpu``, ``numpy``: synchronisations
there). Rank 0 also returns a ``cProfile`` listing of one step.
"""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import io
import pstats
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import splash_core
from splash_core import dtypes
from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights
from splash_core.planning import ownership
from splash_core.platform.interfaces import MLAKernels
from splash_core.profiles.model import LayerStack, MLAConfig, ModelProfile
from splash_core.runtime.kv_pool import held_pages
from splash_core.runtime.model import Model
from splash_core.runtime.model_config import ModelConfig, RankOps
from splash_core.runtime.step_batch import StepBatch, StepRequest

from .kernels import kernels_for

PHASES = ("decode", "decode_open", "prefill")


def tiny_deepseek(layers: int) -> ModelProfile:
    """DeepSeek-V3's structure (Q-LoRA, absorbed MLA, no indexer, dense MLP) at widths so small
    that the CPU's arithmetic hardly counts beside the host work around it."""
    return ModelProfile(
        name="tiny-deepseek", hidden_size=64, layers=LayerStack(count=layers),
        mla=MLAConfig(heads=8, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
                      v_head_dim=16),
        vocab_size=256, intermediate_size=128, source="bench/runtime_host_profile.py: host-overhead stand-in")


class _Marks:
    """Per-layer clocks of one step and the time spent inside kernels and collectives.

    Host work is measured in the thread's CPU time (``time.thread_time``): ranks share the host's
    cores with each other (and with whatever else runs), so wall time would count waiting for a
    core or for the other rank; the step itself is also timed on the wall clock."""

    def __init__(self, layers: int):
        self.layer = -1  # -1: before the first layer (embedding, page reservation)
        self.t = np.zeros(layers + 2)  # CPU time at step start, each layer's mark, step end
        self.wall = np.zeros(2)  # wall clock at step start and end
        # CPU seconds inside kernels / collectives and collective calls: before the first layer, by layer
        self.inside = {"kernel": np.zeros(layers + 2), "collective": np.zeros(layers + 2)}
        self.collectives = np.zeros(layers + 2, dtype=np.int64)
        self.busy = False  # inside a kernel or collective: its own torch operations are not counted

    def __call__(self, i: int) -> None:
        self.layer = i
        self.t[i + 1] = time.thread_time()


def _timed(fn, marks: list, what: str):
    """``fn`` adding its CPU time to the current step's ``what`` account (by layer)."""

    def call(*args, **kwargs):
        m = marks[0]
        m.busy = True
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            m.inside[what][m.layer + 1] += time.thread_time() - t0
            if what == "collective":
                m.collectives[m.layer + 1] += 1
            m.busy = False

    return call


def _timed_kernels(kernels: MLAKernels, marks: list) -> MLAKernels:
    return dataclasses.replace(kernels, decode=_timed(kernels.decode, marks, "kernel"),
                               extend=_timed(kernels.extend, marks, "kernel"),
                               merge=_timed(kernels.merge, marks, "kernel"))


class _TimedCollectives:
    """The group's collectives, each call timed: on CPU they block until every rank arrives, so
    their time is mostly waiting for the slower rank and is kept out of the runtime's."""

    CALLS = ("all_gather_into", "all_to_all", "all_reduce", "broadcast", "all_gather_object", "broadcast_object")

    def __init__(self, inner, marks: list):
        self._inner = inner
        for name in self.CALLS:
            setattr(self, name, _timed(getattr(inner, name), marks, "collective"))

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Counter(TorchDispatchMode):
    """Counts, per layer, torch operations issued outside the kernels."""

    def __init__(self, marks: list, buckets: int):
        super().__init__()
        self.marks, self.ops = marks, np.zeros(buckets, dtype=np.int64)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        m = self.marks[0]
        if not m.busy:
            self.ops[m.layer + 1] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _count_host_traffic(marks: list, buckets: int):
    """Counts per layer (outside the kernels) host data turned into tensors and tensor values
    read back on the host, by wrapping the torch entry points that do so."""
    copies, reads = np.zeros(buckets, dtype=np.int64), np.zeros(buckets, dtype=np.int64)
    saved = []

    def patch(owner, name, counts, host_input: bool):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            m = marks[0]
            if not m.busy and (not host_input or (args and not isinstance(args[0], torch.Tensor))):
                counts[m.layer + 1] += 1
            return original(*args, **kwargs)

        saved.append((owner, name, original))
        setattr(owner, name, counted)

    for name in ("as_tensor", "tensor", "from_numpy"):
        patch(torch, name, copies, host_input=True)
    for name in ("item", "tolist", "cpu", "numpy"):
        patch(torch.Tensor, name, reads, host_input=False)
    try:
        yield copies, reads
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _requests(phase: str, batch: int, context: int, chunk: int, page_size: int, T: int) -> list[StepRequest]:
    """The step's requests: owners round-robin; histories of ``context`` tokens after the step."""
    if phase == "prefill":
        return [StepRequest(i, i % T, context - chunk, chunk) for i in range(batch)]
    if phase == "decode":
        return [StepRequest(i, i % T, context - 1, 1) for i in range(batch)]
    # request 0 starts a page this step; the others stay inside their last page
    return [StepRequest(i, i % T, context if i == 0 else context - 1 - i % (page_size - 1), 1) for i in range(batch)]


def _fill(model: Model, requests: list[StepRequest]) -> None:
    """Every layer holds each request's history before the step (``start`` tokens) by its layout."""
    for layer in model.paged_layers:
        for rid in list(layer.kv.requests):
            layer.kv.free(rid)
        for r in requests:
            pages = np.arange(int(ownership.pages_for(r.start, model.page_size)))
            layer.kv.alloc(r.id, held_pages(layer.layout, r.id, r.owner, pages, model.rank, model.T))


def _undo_new_pages(model: Model, requests: list[StepRequest]) -> None:
    """Free the pages the step opened, so the next repetition opens them again."""
    for r in requests:
        first = int(ownership.pages_for(r.start, model.page_size))
        end = int(ownership.pages_for(r.start + r.rows, model.page_size))
        if end > first:
            for layer in model.paged_layers:
                layer.kv.free(r.id, np.arange(first, end))


def measure(ctx, spec: dict) -> dict:
    """Time ``spec['reps']`` steps of every phase in ``spec['layout']``; counts and (rank 0) a profile;
    ``splash_core`` names the checkout measured."""
    torch.manual_seed(spec["seed"])
    profile = tiny_deepseek(spec["layers"])
    dtype, layout, T = dtypes.torch_dtype(spec["dtype"]), Layout(spec["layout"]), ctx.world_size
    ps, B, context, chunk = spec["page_size"], spec["batch"], spec["context"], spec["chunk"]
    marks = [_Marks(spec["layers"])]
    kernels = _timed_kernels(kernels_for(ctx, dtype, spec["kernels"]), marks)
    pages = B * (int(ownership.pages_for(context, ps)) + 1)
    model = Model(ModelConfig(profile, layout, pages_per_layer=pages, page_size=ps, dtype=dtype),
                  RankOps(ctx.rank, T, ctx.device, _TimedCollectives(ctx.collectives, marks), kernels),
                  SeededWeights(spec["seed"]))
    for layer in model.paged_layers:
        layer.kv.kv.normal_()
    out = {"samples": [], "counts": {}, "profile": {}, "splash_core": str(Path(splash_core.__file__).parents[1])}
    buckets = spec["layers"] + 2
    for phase in PHASES:
        requests = _requests(phase, B, context, chunk, ps, T)
        _fill(model, requests)
        tokens = torch.randint(0, profile.vocab_size, (sum(r.rows for r in requests),), device=ctx.device)

        def step(before_layer):
            marks[0] = m = _Marks(spec["layers"])
            batch = StepBatch.build(requests, T, ps)  # fresh, as the engine builds one per step
            ctx.collectives.barrier()
            ctx.streams.synchronize()
            m.wall[0], m.t[0] = time.perf_counter(), time.thread_time()
            model.step(batch, tokens, before_layer=before_layer or m)
            ctx.streams.synchronize()
            m.wall[1], m.t[-1] = time.perf_counter(), time.thread_time()
            _undo_new_pages(model, requests)
            return m

        for rep in range(spec["warmup"] + spec["reps"]):
            m = step(None)
            if rep >= spec["warmup"]:
                # layer i: from its mark to the next; the last layer's span also holds the LM head
                layer_s = np.diff(m.t[1:])
                out["samples"].append({
                    "layout": str(layout), "phase": phase, "rep": rep - spec["warmup"], "rank": ctx.rank,
                    "step_ms": (m.wall[1] - m.wall[0]) * 1e3,
                    "layer_us": [float(x) * 1e6 for x in layer_s],
                    "kernel_us": [float(x) * 1e6 for x in m.inside["kernel"][1:-1]],
                    "collective_us": [float(x) * 1e6 for x in m.inside["collective"][1:-1]]})
        # untimed: counts per layer, outside the kernels
        with _count_host_traffic(marks, buckets) as (copies, reads), _Counter(marks, buckets) as counter:
            step(lambda i: setattr(marks[0], "layer", i))
        out["counts"][phase] = {"ops": counter.ops.tolist(), "copies": copies.tolist(), "reads": reads.tolist(),
                                "collectives": marks[0].collectives.tolist()}
        if ctx.rank == 0:
            prof = cProfile.Profile()
            prof.enable()
            step(None)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(spec["top"])
            out["profile"][phase] = text.getvalue()
        else:
            step(None)
    return out
