"""NaN indexer scores fail the step without a wait per layer: ``Model.step`` raises at its end and
``Model.step_tokens`` when its tokens reach the host (``StepTokens.host``), naming the cause; with
sound weights the same run goes through, in float32 and in bf16 (so the check is what fails). The top-k over ranking keys
equals a stable descending sort on rows full of ties, -0.0, ±inf and subnormals."""

from __future__ import annotations

import pytest
import torch
from test_dsa_checkpoint import write_v32

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.layouts import Layout
from splash_core.model.dsa_slots import NAN_SCORES, top_k_slots
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.runtime.model import Model

PROMPTS = ([3, 17, 5, 99, 23, 8, 41, 2, 77, 120, 15, 64, 33, 9, 101, 44, 58, 7, 150, 6, 12],)


def _run(ctx, folder, poison: bool, through_tokens: bool, dtype=torch.float32) -> str:
    profile = profile_from_checkpoint(folder)
    model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), Layout.TP, pages_per_layer=32,
                               page_size=4, dtype=dtype, sparse_attention=True)
    if poison:
        model.layers[1].indexer.weights_proj.fill_(float("nan"))

    def step(batch, tokens):
        if not through_tokens:
            return model.step(batch, tokens)
        out = model.step_tokens(batch, tokens)
        out.host()
        return out.logits()

    try:
        generate(step, [Prompt(0, 0, tuple(PROMPTS[0]))], T=1, page_size=4, chunk=8, new_tokens=2,
                 release=model.release)
    except ValueError as exc:
        return str(exc)
    return ""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("v32-nan")
    write_v32(folder, PROMPTS)
    return str(folder)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("through_tokens", [False, True])
def test_nan_indexer_scores_fail_the_step(rank_pools, folder, through_tokens, dtype):
    assert rank_pools(1).run(_run, folder, False, through_tokens, dtype)[0] == ""  # a sound run at bf16's error too
    assert rank_pools(1).run(_run, folder, True, through_tokens, dtype)[0] == NAN_SCORES


def _stable_sort_top_k(scores, k):
    top = torch.sort(scores, dim=1, descending=True, stable=True)
    values, slots = top.values[:, :k], top.indices[:, :k]
    return torch.where(torch.isneginf(values), -1, slots).to(torch.int32), values


def test_ranking_keys_select_as_a_stable_sort():
    gen = torch.Generator().manual_seed(0)
    for _ in range(100):
        n, s, k = (int(torch.randint(1, hi, (), generator=gen)) for hi in (6, 60, 70))
        x = torch.randint(-3, 4, (n, s), generator=gen).float() / 2
        for value, share in ((float("-inf"), 0.2), (-0.0, 0.1), (float("inf"), 0.05), (1e-40, 0.05)):
            x[torch.rand(n, s, generator=gen) < share] = value
        want, got = _stable_sort_top_k(x, min(k, s)), top_k_slots(x, k)
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1]), (x, k)
    flags = []
    top_k_slots(torch.tensor([[float("nan"), 1.0]]), 1, flags)  # reported, not raised
    assert len(flags) == 1 and bool(flags[0])
