"""DSA kernels (lightning indexer + top-k, sparse absorbed-MLA attention) against plain-torch
formulas, in Triton's interpreter on CPU at tiny sizes. fp32 and fp16 only: the interpreter
computes bf16 dots wrongly (see tests/test_kernels_mla.py). The formulas follow transformers'
DeepseekV32Indexer: score[i, j] = sum_h w[i, h] * ReLU(scale * q[i, h] . k[j]) over visible keys."""

from __future__ import annotations

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch

from splash_core.kernels import interpreter
from splash_core.kernels.config import AttentionTile
from splash_core.kernels.dsa_attention import sparse_attention
from splash_core.kernels.dsa_indexer import DECODE_INDEXER_TILE, PREFILL_INDEXER_TILE, indexer_scores
from splash_core.model.dsa_slots import key_positions, top_k_slots
from splash_core.reference import mla as ref
from splash_core.reference.dsa import index_scores as ref_scores
from splash_core.reference.dsa import sparse_attention as ref_sparse
from splash_core.testing.mla_inputs import decode_case, extend_case, scaled_fp8_case, tolerance

CPU = torch.device("cpu")
INDEX_DIM = 32
interpreter.patch_scalar_index()


def _indexer_inputs(case, heads: int, dtype, seed: int = 5):
    """(q, weights, index_keys) beside an MLA ``case``: indexer keys in the same physical pages."""
    g = torch.Generator().manual_seed(seed)
    rows, pages, page = case[0].shape[0], case[1].shape[0], case[1].shape[1]
    q = torch.randn(rows, heads, INDEX_DIM, generator=g).to(dtype)
    weights = torch.randn(rows, heads, generator=g) * heads ** -0.5  # signed, as a weight projection gives
    keys = torch.randn(pages, page, INDEX_DIM, generator=g).to(dtype)
    return q, weights, keys


def indexer_top_k(q, weights, keys, table, page_index, row_req, row_pos, scale, top_k):
    return top_k_slots(indexer_scores(q, weights, keys, table, page_index, row_req, row_pos, scale), top_k)


def _check_attention(got, want, dtype):
    (out, lse), (ref_out, ref_lse) = got, want
    atol, rtol = tolerance(dtype)
    empty = torch.isneginf(ref_lse)
    assert (~empty).any(), "no row attends to any key: nothing would be compared"
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    assert torch.equal(torch.isneginf(lse), empty)
    assert torch.all(out[empty] == 0)
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=atol, rtol=rtol)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=atol, rtol=rtol)


def _check_selection(slots, values, want_scores, top_k, dtype):
    """Selected slots are distinct visible keys whose scores are the best ``top_k`` (ties may pick
    either key, so the scores are compared, not the slots); -1 pads exactly the missing ones."""
    atol, rtol = tolerance(dtype)
    visible = (~torch.isneginf(want_scores)).sum(1)
    assert visible.sum() > 0, "no row sees any key: nothing would be compared"
    assert torch.equal((slots >= 0).sum(1), visible.clamp(max=top_k))
    assert not torch.isnan(values).any()
    for row in range(slots.shape[0]):
        chosen = slots[row][slots[row] >= 0].long()
        assert chosen.unique().numel() == chosen.numel()
        best = torch.topk(want_scores[row], chosen.numel()).values
        got = want_scores[row, chosen]
        assert torch.isfinite(got).all(), f"row {row} selected an invisible key"
        torch.testing.assert_close(got.sort(descending=True).values, best, atol=atol, rtol=rtol)
        torch.testing.assert_close(values[row, :chosen.numel()], got, atol=atol, rtol=rtol)


MAKERS = {"decode": decode_case, "extend": extend_case}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("entry", ["decode", "extend"])
def test_indexer_scores_and_top_k_match_the_formula(entry, dtype):
    """Shuffled pages, a hole, a CP-style request holding odd pages, one holding nothing, extend
    rows that see nothing; 20 heads (two head blocks, one partial); top-k below and above the
    visible count (then every visible key, padded with -1)."""
    case = MAKERS[entry](CPU, dtype, heads=2, dims=(32, 16), page=8)
    _, _, table, page_index, row_req, row_pos, *_ = case
    table[0, 2] = -1
    q, weights, keys = _indexer_inputs(case, 20, dtype)
    scale = INDEX_DIM ** -0.5
    want = ref_scores(q, weights, keys, table, page_index, row_req, row_pos, scale)
    got = indexer_scores(q, weights, keys, table, page_index, row_req, row_pos, scale)
    atol, rtol = tolerance(dtype)
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)) and torch.isneginf(want).any()
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    for top_k in (8, 1000):
        slots, values = indexer_top_k(q, weights, keys, table, page_index, row_req, row_pos, scale, top_k)
        _check_selection(slots, values, want, top_k, dtype)
    positions = key_positions(slots, page_index, row_req, 8)
    assert torch.all(positions <= row_pos.long()[:, None]) and torch.equal(positions < 0, slots < 0)


@pytest.mark.parametrize("tile", [DECODE_INDEXER_TILE, PREFILL_INDEXER_TILE, AttentionTile(rows=4, heads=8, keys=16)])
@pytest.mark.parametrize("entry", ["decode", "extend"])
def test_every_indexer_tile_scores_alike(entry, tile):
    """One row a program, blocks of rows spanning several requests (a pass per request, the other
    rows masked) and blocks past the last row give the formula's scores."""
    case = MAKERS[entry](CPU, torch.float32, heads=2, dims=(32, 16), page=8)
    _, _, table, page_index, row_req, row_pos, *_ = case
    q, weights, keys = _indexer_inputs(case, 20, torch.float32)
    want = ref_scores(q, weights, keys, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5)
    got = indexer_scores(q, weights, keys, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5, tile=tile)
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)) and torch.isneginf(want).any()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("groups", [1, 4])
def test_scaled_fp8_indexer_keys_score_as_their_dequantized_values(groups):
    """Indexer keys stored as the pool stores them for fp8 models (e4m3 codes + float32 scales)."""
    from splash_core.model.fp8_cache import dequantize, quantize
    from splash_core.model.kv_format import ScaledFP8

    case = decode_case(CPU, torch.float32, heads=2, dims=(32, 16), page=8)
    _, _, table, page_index, row_req, row_pos, *_ = case
    q, weights, keys = _indexer_inputs(case, 3, torch.float32)
    layout = ScaledFP8(INDEX_DIM, 0, groups)
    stored = quantize(keys.reshape(-1, INDEX_DIM), layout).view(*keys.shape[:2], layout.token_bytes)
    assert stored.dtype == torch.uint8 and stored.shape[2] == INDEX_DIM + 4 * groups
    plain = dequantize(stored, layout).float()
    want = ref_scores(q, weights, plain, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5)
    got = indexer_scores(q, weights, stored, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.isneginf(want).any() and torch.isfinite(want).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("entry", ["decode", "extend"])
def test_sparse_attention_matches_the_formula(entry, dtype):
    """Rows attend to their indexer-selected slots (top 12, -1 padded, rows with none), 20 heads."""
    case = MAKERS[entry](CPU, dtype, heads=20, dims=(32, 16), page=8)
    q, cache, table, page_index, row_req, row_pos, scale, v_dim = case
    iq, weights, keys = _indexer_inputs(case, 4, dtype)
    slots, _ = indexer_top_k(iq, weights, keys, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5, 12)
    assert (slots < 0).any() and (slots >= 0).any()
    tile = AttentionTile(rows=1, heads=16, keys=16)
    got = sparse_attention(q, cache, table, row_req, slots, scale, v_dim, tile=tile)
    _check_attention(got, ref_sparse(q, cache, table, row_req, slots, scale, v_dim), dtype)


def test_selecting_every_visible_key_is_dense_attention_and_halves_merge():
    """top-k above the history equals the dense MLA reference; splitting each row's selection in
    two (as two CP ranks would hold it) and merging by lse gives the same result."""
    case = extend_case(CPU, torch.float32, heads=3, dims=(32, 16), page=8)
    q, cache, table, page_index, row_req, row_pos, scale, v_dim = case
    iq, weights, keys = _indexer_inputs(case, 2, torch.float32)
    slots, _ = indexer_top_k(iq, weights, keys, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5, 4096)
    whole = sparse_attention(q, cache, table, row_req, slots, scale, v_dim)
    _check_attention(whole, ref.attention(*case), torch.float32)
    odd = torch.where(torch.arange(slots.shape[1]) % 2 == 1, slots, -1)
    even = torch.where(torch.arange(slots.shape[1]) % 2 == 0, slots, -1)
    parts = [sparse_attention(q, cache, table, row_req, s, scale, v_dim) for s in (odd, even)]
    merged = ref.merge(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    _check_attention(merged, ref.attention(*case), torch.float32)


def test_scaled_fp8_cache_is_read_like_the_dense_kernel_and_unheld_slots_are_skipped():
    """Slot 17 lies on a hole (-1) of request 0's table and ``past`` just past its end (where
    request 1's first page would be read): both are skipped."""
    case = scaled_fp8_case(decode_case(CPU, torch.float16, heads=3, dims=(32, 16), page=8), 4)
    q, cache, table, page_index, row_req, row_pos, scale, v_dim = case
    assert cache.dtype == torch.uint8
    table[0, 2] = -1
    past = table.shape[1] * 8 + 3
    slots = torch.tensor([[0, 5, 17, past, 40], [3, 2, 1, 0, -1], [8, 9, -1, -1, -1], [-1, -1, -1, -1, -1]])
    got = sparse_attention(q, cache, table, row_req, slots, scale, v_dim)
    _check_attention(got, ref_sparse(q, cache, table, row_req, slots, scale, v_dim), torch.float16)


def test_checks_fail_on_planted_faults():
    """A wrong slot, a NaN, an empty selection and an invisible pick each make the checks fail."""
    case = decode_case(CPU, torch.float32, heads=3, dims=(32, 16), page=8)
    q, cache, table, page_index, row_req, row_pos, scale, v_dim = case
    slots = torch.tensor([[0, 5, 17, -1], [3, 2, 1, 0], [8, 9, -1, -1], [-1, -1, -1, -1]])
    want = ref_sparse(q, cache, table, row_req, slots, scale, v_dim)
    wrong = slots.clone()
    wrong[0, 1] = 6
    with pytest.raises(AssertionError):
        _check_attention(sparse_attention(q, cache, table, row_req, wrong, scale, v_dim), want, torch.float32)
    out, lse = sparse_attention(q, cache, table, row_req, slots, scale, v_dim)
    _check_attention((out, lse), want, torch.float32)
    out[1, 0, 0] = float("nan")
    with pytest.raises(AssertionError):
        _check_attention((out, lse), want, torch.float32)
    none = torch.full_like(slots, -1)
    empty = sparse_attention(q, cache, table, row_req, none, scale, v_dim)
    assert torch.isneginf(empty[1]).all() and torch.all(empty[0] == 0)
    with pytest.raises(AssertionError, match="no row attends"):
        _check_attention(empty, ref_sparse(q, cache, table, row_req, none, scale, v_dim), torch.float32)

    iq, weights, keys = _indexer_inputs(case, 2, torch.float32)
    scores = ref_scores(iq, weights, keys, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5)
    picked, values = top_k_slots(scores, 4)
    _check_selection(picked, values, scores, 4, torch.float32)
    worst = picked.clone()
    worst[0, 0] = int(torch.where(torch.isneginf(scores[0]), float("inf"), scores[0]).argmin())
    with pytest.raises(AssertionError):
        _check_selection(worst, values, scores, 4, torch.float32)
    with pytest.raises(AssertionError, match="no row sees"):
        _check_selection(picked[:, :0], values[:, :0], torch.full_like(scores, float("-inf")), 4, torch.float32)
    nan_scores = scores.clone()
    nan_scores[2, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        top_k_slots(nan_scores, 4)


def test_empty_inputs_and_bad_shapes():
    q, cache, table, page_index, row_req, row_pos, scale, v_dim = decode_case(CPU, torch.float32, heads=2,
                                                                              dims=(32, 16), page=8)
    slots = torch.zeros(4, 3, dtype=torch.int32)
    out, lse = sparse_attention(q[:0], cache, table, row_req[:0], slots[:0], scale, v_dim)
    assert out.shape == (0, 2, 32) and lse.shape == (0, 2)
    with pytest.raises(ValueError, match="share W"):
        sparse_attention(q[..., :40], cache, table, row_req, slots, scale, v_dim)
    with pytest.raises(ValueError, match="slots must be"):
        sparse_attention(q, cache, table, row_req, slots[:2], scale, v_dim)
    with pytest.raises(ValueError, match="v_dim"):
        sparse_attention(q, cache, table, row_req, slots, scale, 48)
    iq = torch.randn(4, 2, INDEX_DIM)
    keys = torch.randn(cache.shape[0], 8, INDEX_DIM)
    with pytest.raises(ValueError, match="share D"):
        indexer_scores(iq[..., :16], torch.ones(4, 2), keys, table, page_index, row_req, row_pos, 1.0)
    with pytest.raises(ValueError, match="weights must be"):
        indexer_scores(iq, torch.ones(4, 3), keys, table, page_index, row_req, row_pos, 1.0)
    with pytest.raises(ValueError, match="leaves a partial scale"):
        indexer_scores(iq, torch.ones(4, 2), torch.zeros(cache.shape[0], 8, INDEX_DIM + 3, dtype=torch.uint8), table,
                       page_index, row_req, row_pos, 1.0)
    with pytest.raises(ValueError, match="top_k must be"):
        top_k_slots(torch.zeros(2, 3), 0)
    scores = indexer_scores(iq[:0], torch.ones(0, 2), keys, table, page_index, row_req[:0], row_pos[:0], 1.0)
    assert scores.shape == (0, table.shape[1] * 8)


def test_selection_agrees_with_transformers_indexer():
    """transformers' DeepseekV32Indexer on one 24-token prefill (rotation at position 0, i.e. none,
    so its q and k are its projections; causality from the mask) selects keys whose scores, under
    this file's formula, are the same as the kernel's picks: the formula is transformers'."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as v32

    config = v32.DeepseekV32Config(hidden_size=64, q_lora_rank=32, qk_rope_head_dim=16, index_head_dim=INDEX_DIM,
                                   index_n_heads=4, index_topk=8)
    torch.manual_seed(3)
    indexer = v32.DeepseekV32Indexer(config, 0).float().eval()
    tokens = 24
    hidden, q_resid = torch.randn(1, tokens, 64), torch.randn(1, tokens, 32)
    zeros = torch.zeros(1, tokens, dtype=torch.long)
    cos, sin = v32.DeepseekV32RotaryEmbedding(config)(hidden, zeros)
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()[None]
    picked = indexer(hidden, q_resid, (cos, sin), causal, zeros)[0].long()  # [T, topk] positions
    with torch.no_grad():
        q = indexer.wq_b(q_resid[0]).view(tokens, 4, INDEX_DIM)
        k = indexer.k_norm(indexer.wk(hidden[0]))
        weights = indexer.weights_proj(hidden[0]) * 4 ** -0.5
    order = torch.randperm(tokens // 8, generator=torch.Generator().manual_seed(1))  # shuffled physical pages
    keys = torch.zeros(tokens // 8, 8, INDEX_DIM)
    keys[order] = k.view(tokens // 8, 8, INDEX_DIM)
    table, page_index = order[None].int(), torch.arange(tokens // 8, dtype=torch.int32)[None]
    row_req, row_pos = torch.zeros(tokens, dtype=torch.int32), torch.arange(tokens, dtype=torch.int32)
    slots, values = indexer_top_k(q, weights, keys, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5, 8)
    want = ref_scores(q, weights, keys, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5)
    _check_selection(slots, values, want, 8, torch.float32)
    positions = key_positions(slots, page_index, row_req, 8)
    for row in range(7, tokens):  # rows seeing at least top-k keys (earlier ones: transformers picks masked keys)
        theirs = want[row, picked[row]].sort().values  # slot = position: logical pages listed in order
        ours = want[row, slots[row].long()].sort().values
        torch.testing.assert_close(ours, theirs)
        assert set(positions[row].tolist()) <= set(range(row + 1))
