"""Rank-side work of ``bench/costmodel_check.py --dsa``: what SPLASH's runtime does for a model
that attends sparsely (DeepSeek Sparse Attention), counted step by step, for the cost model to
be held against (:func:`costmodel_check.check_dsa`).

Per layout, a tiny V3.2-shaped model (tiny-mla's dims with its DSA indexer, top-k ``topk``)
serves a few requests on the group's ranks with decode graphs asked for (mode ``static``), and
every step records its batch, whether the model runs decode steps from graphs at all, and per
layer on this rank: the rows the indexer scored and the (row, key) pairs sparse attention attended
(in all-head units: a rank computing h of H heads counts h/H a pair), counted by wrapping the
backend's ``index_scores`` and ``sparse`` kernels (the torch reference where it has none), and the
bytes received in CP's exchange of top-k candidates: the all-gathers of [rows, 2k] float32 (the
only float32 all-gather of that width in a step of this model; the counting collectives tell them
by that shape). Functions taking ``ctx`` run on every rank of a :class:`~splash_core.runtime.spawn.RankPool`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from splash_bench.driver import Prompt, generate
from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights
from splash_core.planning import ownership
from splash_core.profiles.graphs import GraphConfig
from splash_core.profiles.loader import load
from splash_core.profiles.model import ModelProfile
from splash_core.reference import dsa as reference_dsa
from splash_core.runtime.model import Model
from splash_core.runtime.model_config import ModelConfig, RankOps

MODEL, PAGE_SIZE, CHUNK, SEED = "tiny-mla", 16, 16, 11


def dsa_profile(topk: int, shared_layers: tuple[int, ...] = (), name: str = MODEL) -> ModelProfile:
    """``name``'s profile (it must have an indexer) selecting ``topk`` keys per row, its
    ``shared_layers`` reusing the previous selecting layer's top-k (GLM-5)."""
    base = load("model", name)
    if base.indexer is None:
        raise ValueError(f"model {name!r} has no DSA indexer")
    return dataclasses.replace(base, indexer=dataclasses.replace(base.indexer, topk=topk,
                                                                 shared_layers=tuple(shared_layers)))


class CountingKernels:
    """Rows scored and pairs attended through ``kernels``' sparse-attention entry points."""

    def __init__(self, kernels, heads: int):
        self.scorer = kernels.index_scores or reference_dsa.index_scores
        self.attend = kernels.sparse or reference_dsa.sparse_attention
        self.heads, self.scored_rows, self.pairs = heads, 0, 0.0
        self.kernels = dataclasses.replace(kernels, index_scores=self.index_scores, sparse=self.sparse)

    def index_scores(self, q, weights, keys, block_table, page_index, row_req, *args):
        # rows whose request holds a page here: a captured step's padding rows hold none and score nothing
        holds = (block_table >= 0).any(dim=1)
        self.scored_rows += int(holds[row_req.long()].sum()) if holds.numel() else 0
        return self.scorer(q, weights, keys, block_table, page_index, row_req, *args)

    def sparse(self, q, kv_cache, block_table, row_req, slots, *args):
        self.pairs += int((slots >= 0).sum()) * q.shape[1] / self.heads
        return self.attend(q, kv_cache, block_table, row_req, slots, *args)


class CountingCollectives:
    """``inner`` with the bytes each top-k candidate all-gather brings this rank counted."""

    def __init__(self, inner, width: int):
        self.inner, self.width, self.received = inner, width, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor, *args, **kwargs):
        if tensor.dtype == torch.float32 and tensor.dim() == 2 and tensor.shape[1] == self.width:
            self.received += (out.numel() - tensor.numel()) * out.element_size()
        return self.inner.all_gather_into(out, tensor, *args, **kwargs)


def count_layout(ctx, spec: dict) -> list[dict]:
    """One layout's steps on this rank: per step the batch (ids, owners, contexts, rows), whether
    the model runs decode steps from graphs, and per layer (the mean over ``spec['layers']``) the
    candidate bytes received, the rows the indexer scored and the pairs attended sparsely."""
    profile = dsa_profile(spec["topk"], spec.get("shared_layers", ()))
    layers = spec["layers"]
    prompts = [Prompt(i, owner, tuple(int(t) for t in np.random.default_rng(SEED + i).integers(0, 256, n)))
               for i, (n, owner) in enumerate(zip(spec["prompts"], spec["owners"]))]
    pages = sum(int(ownership.pages_for(len(p.tokens) + spec["new_tokens"], PAGE_SIZE)) for p in prompts)
    config = ModelConfig(profile, Layout(spec["layout"]), pages_per_layer=pages, page_size=PAGE_SIZE,
                         num_layers=layers, graphs=GraphConfig(mode="static"), sparse_attention=True)
    ops = RankOps.of(ctx, config)
    counting = CountingCollectives(ops.collectives, 2 * spec["topk"])
    kernels = CountingKernels(ops.kernels, profile.mla.heads)
    model = Model(config, dataclasses.replace(ops, collectives=counting, kernels=kernels.kernels), SeededWeights(SEED))
    records = []

    def step(batch, tokens):
        before = counting.received, kernels.scored_rows, kernels.pairs
        logits = model.step(batch, tokens)
        records.append({"ids": batch.ids.tolist(), "owners": batch.owners.tolist(),
                        "contexts": batch.contexts.tolist(), "rows": batch.rows.tolist(),
                        "graphs": model.graphs is not None, "candidate_bytes": (counting.received - before[0]) / layers,
                        "scored_rows": (kernels.scored_rows - before[1]) / layers,
                        "attended_pairs": (kernels.pairs - before[2]) / layers})
        return logits

    generate(step, prompts, T=ctx.world_size, page_size=PAGE_SIZE, chunk=CHUNK, new_tokens=spec["new_tokens"],
             release=model.release)
    return records
