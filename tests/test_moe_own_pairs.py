"""A rank builds only its own experts' (row, expert) pairs in large steps (issue 38): at T = 2 on the
tiny DeepSeek-V3 checkpoint (routed experts split over the ranks), the logits of every step are the
same bits whether the ranks build every routed pair or only their own, and fewer rows reach the
grouped matmuls when they build their own."""

from __future__ import annotations

import torch

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.checkpoint.tiny import ensure
from splash_core.layouts import Layout
from splash_core.model import experts
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.runtime import feed_forward
from splash_core.runtime.model import Model

PROMPTS = ([3, 17, 5, 99, 23, 8, 41, 2, 77, 120, 15, 64, 33], [88, 4, 131, 27, 60, 19, 2, 140, 70])


def _run(ctx, folder: str, own_from: int):
    feed_forward.OWN_PAIRS_FROM = own_from  # this rank process only
    built = []
    original = experts.grouped_linear
    experts.grouped_linear = lambda rows, w, counts: built.append(rows.shape[0]) or original(rows, w, counts)
    profile = profile_from_checkpoint(folder)
    model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), Layout.DP, pages_per_layer=16,
                               page_size=8, dtype=torch.float32)
    prompts = [Prompt(i, i % ctx.world_size, tuple(p)) for i, p in enumerate(PROMPTS)]
    got = generate(model.step, prompts, T=ctx.world_size, page_size=8, chunk=8, new_tokens=4, release=model.release)
    experts.grouped_linear = original
    return [logits.copy() for _, logits in got.steps], sum(built)


def test_own_pairs_give_the_same_logits_from_fewer_rows(rank_pools):
    folder = str(ensure("tiny-deepseek-v3"))
    pool = rank_pools(2)
    every = pool.run(_run, folder, 10 ** 9)
    own = pool.run(_run, folder, 1)
    for rank in range(2):
        (want, rows_every), (got, rows_own) = every[rank], own[rank]
        assert len(got) == len(want) > 0
        assert all((a == b).all() for a, b in zip(got, want)), f"rank {rank}: logits differ"
        assert 0 < rows_own < rows_every, (rows_own, rows_every)
