"""Sampling (greedy, temperature, top-k, top-p, seeds, stop ids) and the grouped expert path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splash_core.engine.draws import uniform
from splash_core.engine.requests import Request, State
from splash_core.model import experts
from splash_core.profiles.workload import RequestSpec
from splash_core.runtime import sampling
from splash_core.runtime.sampling import RowDraw, SamplingParams, apply_draws, choose, choose_rows, in_kept, kept


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
    got = apply_draws(rows.argmax(-1), rows, [RowDraw(0, warm, uniform(warm, 7, 3))])
    assert got[1] == 3 and got[0] == choose(logits, warm, uniform(warm, 7, 3))


def _one_row(logits: torch.Tensor, p: SamplingParams, u: float) -> tuple[int, list]:
    """The choice spelled out for one row (the test's own oracle): float64 softmax at the
    temperature; with a filter, most likely first (ties: lower id first), top-k, then the smallest
    prefix whose mass reaches top-p; without one, every token in vocabulary order; then the
    inverse CDF of what is kept at u."""
    probs = torch.softmax(logits.double().cpu() / p.temperature, dim=0)
    ids = list(range(len(probs)))
    if p.top_k or p.top_p < 1:
        ids.sort(key=lambda i: (-float(probs[i]), i))
    if p.top_k:
        ids = ids[:p.top_k]
    if p.top_p < 1:
        mass, cut = 0.0, len(ids)
        for n, i in enumerate(ids):
            mass += float(probs[i])
            if mass >= p.top_p:
                cut = n + 1
                break
        ids = ids[:cut]
    cdf = np.cumsum([float(probs[i]) for i in ids])
    return ids[min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(ids) - 1)], ids


def _mixed_rows(rows: int, vocab: int, seed: int):
    """Logits with many exact ties (rounded to a coarse grid) and a mix of filters per row."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.round(torch.randn(rows, vocab, generator=g) * 8) / 4
    menu = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.6, top_k=5),
            SamplingParams(temperature=1.0, top_k=17), SamplingParams(temperature=0.5, top_k=1),
            SamplingParams(temperature=1.3, top_p=0.9), SamplingParams(temperature=0.8, top_k=3 * vocab),
            SamplingParams(temperature=2.0, top_k=40, top_p=0.5), SamplingParams(temperature=1.0, top_p=1e-9)]
    params = [menu[r % len(menu)] for r in range(rows)]
    uniforms = torch.rand(rows, generator=g, dtype=torch.float64).tolist()
    return logits, params, uniforms


@pytest.mark.parametrize("chunk", [1 << 22, 300])  # one pass, and passes of 2 rows
def test_rows_sampled_together_equal_each_row_spelled_out(monkeypatch, chunk):
    monkeypatch.setattr(sampling, "_CHUNK_ELEMENTS", chunk)
    logits, params, uniforms = _mixed_rows(32, 150, seed=3)
    expected = [_one_row(row, p, u) for row, p, u in zip(logits, params, uniforms)]
    assert choose_rows(logits, params, uniforms).tolist() == [t for t, _ in expected]
    assert [choose(row, p, u) for row, p, u in zip(logits, params, uniforms)] == [t for t, _ in expected]
    assert [kept(row, p)[1].tolist() for row, p in zip(logits, params)] == [k for _, k in expected]  # and in order
    inside = torch.tensor([t for t, _ in expected])
    assert in_kept(logits, params, inside).all()
    filtered = [r for r, (_, k) in enumerate(expected) if len(k) < 150]  # rows whose filters drop tokens
    outside = torch.tensor([min(set(range(150)) - set(expected[r][1])) for r in filtered])
    assert len(filtered) >= 12 and not in_kept(logits[filtered], [params[r] for r in filtered], outside).any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rows_sampled_on_the_device_equal_the_host_choice():
    logits, params, uniforms = _mixed_rows(64, 129280 // 8, seed=5)
    draws = [RowDraw(r, p, u) for r, (p, u) in enumerate(zip(params, uniforms)) if r % 4]  # every 4th row greedy
    host = apply_draws(logits.argmax(-1), logits, draws)
    assert apply_draws(logits.cuda().argmax(-1), logits.cuda(), draws).tolist() == host.tolist()
    assert host.tolist() == [_one_row(row, p, u)[0] if r % 4 else int(row.argmax())
                             for r, (row, p, u) in enumerate(zip(logits, params, uniforms))]


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
        for own in (False, True):
            assert torch.allclose(experts.expert_outputs(x, weights, chosen, first, gate_up, down, own_pairs_only=own),
                                  want, atol=1e-5)
    finally:
        experts._GROUPED_MM.clear()
        experts._GROUPED_MM.update(saved)
    built = []  # rows each grouped matmul was given: every pair, or this rank's only
    original = experts.grouped_linear
    try:
        experts.grouped_linear = lambda rows, w, counts: built.append(rows.shape[0]) or original(rows, w, counts)
        for own in (False, True):
            got = experts.expert_outputs(x, weights, chosen, first, gate_up, down, own_pairs_only=own)
            assert torch.allclose(got, want, atol=1e-5)
    finally:
        experts.grouped_linear = original
    mine = int(((chosen >= first) & (chosen < first + held)).sum())
    assert built == [n * k, n * k, mine, mine] and (mine < n * k or held == total)
