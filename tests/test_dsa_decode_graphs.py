"""DeepSeek Sparse Attention's decode steps from the padded persistent buffers of decode graphs
(mode ``static``: the captured step's code, run as recorded on CPU ranks): GLM-5's tiny
checkpoint written by transformers (full and shared indexer layers, top-k 6) gives transformers'
logits (within 1e-4) and greedy tokens in every layout at T = 2 through the sparse graphs (every
context exceeds k); NaN indexer scores inside a replayed
step fail it (the flag travels out of the graph with its logits)."""

from __future__ import annotations

import test_checkpoint_transformers as base
import torch
from test_glm5_checkpoint import TOLERANCE, TOPK, glm5  # noqa: F401 (the fixture)

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.layouts import Layout
from splash_core.model.dsa_slots import NAN_SCORES
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.profiles.graphs import GraphConfig
from splash_core.runtime.model import Model


def _model(ctx, folder, layout):
    profile = profile_from_checkpoint(folder)
    return Model.from_context(ctx, profile, CheckpointWeights(folder, profile), layout, pages_per_layer=16,
                              page_size=base.PAGE, dtype=torch.float32, sparse_attention=True,
                              graphs=GraphConfig(mode="static", min_table_pages=1))


def _prompts(ctx):
    owners = (0, ctx.world_size - 1)
    return [Prompt(i, owners[i], tuple(p)) for i, p in enumerate(base.PROMPTS)]


def _layouts(ctx, folder: str, forced):
    out = {}
    for layout in Layout:
        model = _model(ctx, folder, layout)
        gen = generate(model.step, _prompts(ctx), T=ctx.world_size, page_size=base.PAGE, chunk=base.CHUNK,
                       new_tokens=base.NEW, release=model.release, forced=dict(enumerate(forced)))
        out[str(layout)] = (gen, [(c["bucket"], c["sparse"]) for c in model.graphs.captures])
    return out if ctx.rank == 0 else None


def test_sparse_decode_from_the_graph_buffers_gives_transformers_tokens(rank_pools, glm5):  # noqa: F811
    folder, ref = glm5
    got = rank_pools(2).run(_layouts, folder, [tokens for tokens, _ in ref])[0]
    assert min(len(p) for p in base.PROMPTS) > TOPK  # every decode step selects
    for layout, (gen, captures) in got.items():
        base.assert_equals_transformers(gen, ref, TOLERANCE, layout)
        assert any(sparse for _, sparse in captures), (layout, captures)  # a context beyond k: the sparse graph


def _poisoned(ctx, folder: str) -> str:
    model = _model(ctx, folder, Layout.TP)

    def step(batch, tokens):
        if batch.is_decode:  # prefill ran eagerly and clean; now the replayed steps score NaN
            for layer in model.layers:
                if getattr(layer, "indexer", None) is not None:
                    layer.indexer.weights_proj.fill_(float("nan"))
        out = model.step_tokens(batch, tokens)
        out.host()
        return out.logits()

    try:
        generate(step, _prompts(ctx), T=ctx.world_size, page_size=base.PAGE, chunk=base.CHUNK, new_tokens=3,
                 release=model.release)
    except ValueError as exc:
        return str(exc) + f" (captures: {[c['sparse'] for c in model.graphs.captures]})"
    return ""


def test_nan_scores_in_a_replayed_step_fail_it(rank_pools, glm5):  # noqa: F811
    got = rank_pools(1).run(_poisoned, glm5[0])[0]
    assert got.startswith(NAN_SCORES) and "True" in got, got
