"""Sampling (greedy, temperature, top-k, top-p, seeds, stop ids) and the grouped expert path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splash_core.engine.requests import Request, State
from splash_core.engine.sampling import SamplingParams, choose, kept, next_tokens, uniform
from splash_core.profiles.workload import RequestSpec
from splash_core.runtime import experts


def test_greedy_and_filters():
    logits = torch.tensor([0.5, 3.0, 2.5, -1.0])
    assert choose(logits, SamplingParams(), 0.99) == 1
    assert choose(logits, SamplingParams(temperature=1.0, top_k=1), 0.99) == 1
    assert choose(logits, SamplingParams(temperature=1.0, top_p=1e-6), 0.99) == 1
    probs, ids = kept(logits, SamplingParams(temperature=1.0, top_k=2))
    assert ids.tolist() == [1, 2] and probs.sum() < 1
    full = torch.softmax(logits.double(), 0)
    probs, ids = kept(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.55 + 0.33 reaches 0.8
    assert ids.tolist() == [1, 2] and torch.allclose(probs, full[[1, 2]])
    for bad in (dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_sampling_follows_the_distribution_and_replays_from_the_seed():
    logits = torch.tensor([2.0, 1.0, 0.0, -3.0])
    p = SamplingParams(temperature=1.0, seed=11)
    draws = [choose(logits, p, uniform(p, 7, k)) for k in range(4000)]
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert np.abs(freq - torch.softmax(logits, 0).numpy()).max() < 0.03
    again = [choose(logits, p, uniform(p, 7, k)) for k in range(4000)]
    assert draws == again and draws != [choose(logits, p, uniform(p, 8, k)) for k in range(4000)]
    warm = SamplingParams(temperature=0.5, seed=11)
    rows = torch.stack([logits, logits.flip(0)])
    got = next_tokens(rows, [warm, SamplingParams()], [7, 9], [3, 0])
    assert got[1] == 3 and got[0] == choose(logits, warm, uniform(warm, 7, 3))


def test_a_stop_id_finishes_a_request_early():
    r = Request(RequestSpec(0, 3, 10), np.array([1, 2, 3]), sampling=SamplingParams(stop_token_ids=(5,)))
    r.admit(0, 0)
    r.advance(3, 4, 0)
    r.advance(1, 5, 1)
    assert r.state is State.FINISHED and r.finish_reason == "stop" and r.generated == [4, 5]


@pytest.mark.parametrize("first, held", [(0, 6), (2, 3), (5, 1)])
def test_grouped_experts_equal_one_matmul_per_expert(first, held):
    gen = torch.Generator().manual_seed(first)
    n, k, d, width, total = 9, 2, 16, 8, 6
    x = torch.randn(n, d, generator=gen)
    chosen = torch.stack([torch.randperm(total, generator=gen)[:k] for _ in range(n)])
    chosen[chosen == 4] = 3  # expert 4 gets no rows (an empty group)
    weights = torch.rand(n, k, generator=gen)
    gate_up = torch.randn(held, 2 * width, d, generator=gen)
    down = torch.randn(held, d, width, generator=gen)
    want = torch.zeros(n, d)
    for row in range(n):
        for j in range(k):
            e = int(chosen[row, j]) - first
            if 0 <= e < held:
                both = gate_up[e] @ x[row]
                want[row] += weights[row, j] * (down[e] @ (torch.nn.functional.silu(both[:width]) * both[width:]))
    got = experts.expert_outputs(x, weights, chosen, first, gate_up, down)
    assert torch.allclose(got, want, atol=1e-5)
    saved = dict(experts._GROUPED_MM)
    try:  # the batched fallback for devices or formats without a grouped matmul
        experts._GROUPED_MM.update({("cpu", torch.float32): False})
        assert torch.allclose(experts.expert_outputs(x, weights, chosen, first, gate_up, down), want, atol=1e-5)
    finally:
        experts._GROUPED_MM.clear()
        experts._GROUPED_MM.update(saved)
