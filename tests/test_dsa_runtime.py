"""The runtime's MLA layers with DeepSeek Sparse Attention (``sparse_attention``) give transformers'
logits and greedy tokens on a tiny DeepseekV32ForCausalLM checkpoint (index_topk 6) in all four
layouts at T = 1 and 2 (CP: keys split by position over the ranks, the top-k made global): two
prompts (owners on different ranks, prefill in chunks of 8 rows, so steps
mix prefill and decode rows), fed transformers' own 32 greedy tokens; every step's logits within
1e-4 of transformers' (relative to the largest |logit|) and every greedy token equal.

The same run with dense attention (the runtime's default) is off by far more, so the check can
fail. Pages of 4 tokens, so at T = 2 a CP rank holds every other page of each request.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_dsa_checkpoint import TOPK, write_v32

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.layouts import Layout
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.runtime.model import Model

PAGE, CHUNK = 4, 8
PROMPTS = ([3, 17, 5, 99, 23, 8, 41, 2, 77, 120, 15, 64, 33, 9, 101, 44, 58, 7, 150, 6, 12],
           [88, 4, 131, 27, 60, 19, 2, 140, 70])
LAYOUTS = tuple(Layout)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v32-runtime")
    return str(folder), write_v32(folder, PROMPTS)


def _serve(ctx, folder, forced, sparse):
    """On each rank: both prompts in each layout, teacher-forced with transformers' tokens."""
    profile = profile_from_checkpoint(folder)
    owners = (0, ctx.world_size - 1)
    prompts = [Prompt(i, owners[i], tuple(p)) for i, p in enumerate(PROMPTS)]
    out = {}
    for layout in LAYOUTS:
        model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), layout, pages_per_layer=32,
                                   page_size=PAGE, dtype=torch.float32, sparse_attention=sparse)
        out[str(layout)] = generate(model.step, prompts, T=ctx.world_size, page_size=PAGE, chunk=CHUNK,
                                    new_tokens=len(forced[0]), release=model.release, forced=dict(enumerate(forced)))
    return out if ctx.rank == 0 else None


def _errors(gen, ref) -> np.ndarray:
    """Relative logit error of every step's rows against transformers' logits at that position;
    fails on NaN/inf and on no rows."""
    fed, errors = {i: 0 for i in range(len(PROMPTS))}, []
    scale = max(float(logits.abs().max()) for _, logits in ref)
    for ids, logits in gen.steps:
        for row, rid in enumerate(ids):
            n = len(PROMPTS[rid])
            fed[rid] = min(fed[rid] + CHUNK, n) if fed[rid] < n else fed[rid] + 1
            assert np.isfinite(logits[row]).all()
            errors.append(np.abs(logits[row] - ref[rid][1][fed[rid] - 1].numpy()).max() / scale)
    assert errors, "no rows were compared"
    return np.array(errors)


@pytest.mark.parametrize("T", [1, 2])
def test_sparse_layers_give_transformers_logits_and_tokens(rank_pools, checkpoint, T):
    folder, ref = checkpoint
    forced = [tokens for tokens, _ in ref]
    got = rank_pools(T).run(_serve, folder, forced, True)[0]
    report = {}
    for layout in LAYOUTS:
        gen = got[str(layout)]
        report[str(layout)] = _errors(gen, ref).max()
        assert report[str(layout)] < TOLERANCE, layout
        assert [gen.tokens[rid] for rid in range(len(PROMPTS))] == forced, layout
    print(f"\nT = {T}: max relative logit error vs transformers: "
          + ", ".join(f"{k} {v:.1e}" for k, v in report.items()))
    assert min(len(p) for p in PROMPTS) > TOPK  # every request's late rows attend to a strict subset


def test_dense_layers_differ(rank_pools, checkpoint):
    folder, ref = checkpoint
    got = rank_pools(1).run(_serve, folder, [tokens for tokens, _ in ref], False)[0]
    dense = _errors(got[str(Layout.TP)], ref).max()
    print(f"\ndense attention: max relative logit error vs transformers {dense:.1e}")
    assert dense > 100 * TOLERANCE
