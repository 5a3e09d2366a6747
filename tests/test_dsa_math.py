"""DSA's layout-free math (splash_core.model.dsa) against transformers' DeepseekV32Attention (the oracle).

One tiny attention layer with random weights; SPLASH's indexer, top-k and absorbed sparse MLA
(with the rotary channels de-interleaved as the checkpoint reader does) must give the module's
output in float32: for a causal prefill of 12 tokens with top-k 5 (so most queries drop keys),
and for a decode row (the last query alone against the 12-token history). The indexer has 8
heads with positive weights, so no score ties at the k-th place (transformers' torch.topk breaks
ties arbitrarily, SPLASH by position). Planted faults prove
the comparison can fail: dense attention, a wrong top-k, NaN, no queries.
"""

from __future__ import annotations

import pytest
import torch

from splash_core.model.dsa import IndexerWeights, index_scores, select, sparse_attention, visible
from splash_core.model.rotary import Rotary

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf  # noqa: E402

D, H, DN, DR, DV, DC, RQ, IH, ID, TOPK, S = 32, 4, 8, 8, 8, 16, 24, 8, 16, 5, 12


@pytest.fixture(scope="module")
def oracle():
    """(module, hidden states [1, S, D], its output [S, D], rotary embedding) in float32."""
    torch.manual_seed(3)
    cfg = hf.DeepseekV32Config(
        vocab_size=64, hidden_size=D, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=RQ,
        kv_lora_rank=DC, qk_rope_head_dim=DR, qk_nope_head_dim=DN, v_head_dim=DV, index_n_heads=IH,
        index_head_dim=ID, index_topk=TOPK, num_hidden_layers=1, rope_parameters={"rope_type": "default",
                                                                                   "rope_theta": 10000.0})
    cfg._attn_implementation = "eager"
    attn = hf.DeepseekV32Attention(cfg, 0).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
        attn.indexer.weights_proj.weight.abs_()  # exact ties (all ReLUs zero) stay rare: topk breaks them arbitrarily
    rot = hf.DeepseekV32RotaryEmbedding(cfg)
    x = torch.randn(1, S, D)
    pos = torch.arange(S)[None]
    mask = torch.full((S, S), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        out, _ = attn(x, rot(x, pos), mask, position_ids=pos)
    return attn, x[0], out[0]


def deinterleave(rows: int) -> torch.Tensor:
    """Row order taking interleaved rotary pairs (x0, x1), (x2, x3).. to rotate-half halves."""
    return torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)])


def splash_attention(attn, x: torch.Tensor, queries_at: slice, topk: int = TOPK, dense: bool = False):
    """SPLASH's DSA output [n, D] for the rows ``queries_at`` of ``x`` against the whole history."""
    perm = deinterleave(DR)
    q_b = attn.q_b_proj.weight.view(H, DN + DR, RQ)
    q_b = torch.cat([q_b[:, :DN], q_b[:, DN:][:, perm]], dim=1)
    kv_a = attn.kv_a_proj_with_mqa.weight
    kv_a = torch.cat([kv_a[:DC], kv_a[DC:][perm]])
    kv_b = attn.kv_b_proj.weight.view(H, DN + DV, DC)
    ix = attn.indexer
    iw = IndexerWeights(ix.wq_b.weight, ix.wk.weight, ix.k_norm.weight, ix.k_norm.bias, ix.weights_proj.weight)

    positions = torch.arange(S)
    rotary = Rotary.at(positions, DR, 10000.0)
    q_rot = rotary.rows(queries_at)
    xq = x[queries_at]
    q_in = torch.nn.functional.rms_norm(xq @ attn.q_a_proj.weight.t(), (RQ,), attn.q_a_layernorm.weight, 1e-6)
    q = torch.einsum("nr,hjr->nhj", q_in, q_b)
    q_lat = torch.einsum("nhd,hdc->nhc", q[..., :DN], kv_b[:, :DN])
    q_abs = torch.cat([q_lat, rotary.rows(queries_at)(q[..., DN:])], dim=-1)
    kv = x @ kv_a.t()
    entries = torch.cat([torch.nn.functional.rms_norm(kv[:, :DC], (DC,), attn.kv_a_layernorm.weight, 1e-6),
                         rotary(kv[:, DC:])], dim=-1)

    seen = visible(positions[queries_at], positions)
    scores = index_scores(iw.queries(q_in, q_rot), iw.head_weights(xq), iw.keys(x, rotary), seen)
    if dense:
        scores = torch.where(seen, 0.0, float("-inf"))
        topk = S
    indices, valid = select(scores, topk)
    latent, lse = sparse_attention(q_abs, entries, indices, valid, DC, attn.scaling)
    assert torch.isfinite(lse).all()
    values = torch.einsum("nhc,hvc->nhv", latent, kv_b[:, DN:])
    return values.reshape(xq.shape[0], H * DV) @ attn.o_proj.weight.t()


def check(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Equal within float32 round-off; fails on NaN/inf, on empty input and on a shape mismatch."""
    assert ours.numel() > 0 and ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert torch.isfinite(ours).all() and torch.isfinite(theirs).all()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_prefill_matches_transformers(oracle):
    attn, x, out = oracle
    check(splash_attention(attn, x, slice(0, S)), out)


@torch.no_grad()
def test_decode_row_matches_transformers(oracle):
    attn, x, out = oracle
    check(splash_attention(attn, x, slice(S - 1, S)), out[S - 1:])


@torch.no_grad()
def test_the_check_can_fail(oracle):
    """Dense attention and a different k change the output past the first k rows (sparsity matters);
    NaN and empty input are refused."""
    attn, x, out = oracle
    for wrong in (splash_attention(attn, x, slice(0, S), dense=True), splash_attention(attn, x, slice(0, S), TOPK + 1)):
        torch.testing.assert_close(wrong[:TOPK], out[:TOPK], rtol=1e-5, atol=1e-5)  # all keys fit in k
        with pytest.raises(AssertionError):
            check(wrong, out)
    bad = out.clone()
    bad[3, 0] = float("nan")
    with pytest.raises(AssertionError):
        check(bad, out)
    with pytest.raises(AssertionError):
        check(out[:0], out[:0])


def test_selection_edges():
    """A query seeing fewer keys than k selects all it sees, only those; equal scores rank by
    position (earlier first, wherever the key sits on the axis); no keys at all is refused."""
    scores = torch.tensor([[0.5, float("-inf"), float("-inf")], [0.1, 0.3, float("-inf")]])
    indices, valid = select(scores, 2)
    assert valid.tolist() == [[True, False], [True, True]]
    assert indices[0, 0] == 0 and set(indices[1].tolist()) == {0, 1}
    tied = torch.tensor([[0.0, 2.0, 0.0, 0.0]])
    assert select(tied, 2)[0].tolist() == [[1, 0]]
    assert select(tied, 2, torch.tensor([9, 1, 5, 3]))[0].tolist() == [[1, 3]]
    with pytest.raises(ValueError, match="no keys"):
        select(scores[:, :0], 2)
    out, lse = sparse_attention(torch.ones(1, 2, 4), torch.ones(3, 4), torch.tensor([[1, 2]]),
                                torch.tensor([[False, False]]), 2, 1.0)
    assert (out == 0).all() and torch.isinf(lse).all()
