"""The backend's DeepSeek Sparse Attention kernels (``MLAKernels.index_scores`` and ``sparse``)
match the torch reference (:mod:`splash_core.reference.dsa`) at DeepSeek-V3.2's widths (indexer
64 heads x 128, MLA 576-wide keys, 64 query heads) on the awkward paged inputs of the MLA checks
(shuffled pages, a hole, a CP-style request, one holding nothing), element and scaled-fp8 caches.
The selection is checked by score: ties may pick either key, never a worse or an invisible one."""

from __future__ import annotations

import pytest
import torch

from ..model.dsa_slots import top_k_slots
from ..reference import dsa as ref
from .mla_inputs import decode_case, extend_case, scaled_fp8_case, tolerance

INDEX_HEADS, INDEX_DIM, TOPK = 64, 128, 48


@pytest.fixture(scope="module")
def kernels(conformance_backend, conformance_device, conformance_dtype):
    found = conformance_backend.mla_kernels(conformance_device, conformance_dtype)
    if found.index_scores is None or found.sparse is None:
        pytest.skip(f"{found.name} has no sparse-attention kernels (the runtime runs the torch reference)")
    return found


def _indexer(case, device, dtype, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    rows, pages, page = case[0].shape[0], case[1].shape[0], case[1].shape[1]
    q = torch.randn(rows, INDEX_HEADS, INDEX_DIM, generator=g).to(device=device, dtype=dtype)
    weights = (torch.randn(rows, INDEX_HEADS, generator=g) * INDEX_HEADS ** -0.5).to(device)
    keys = torch.randn(pages, page, INDEX_DIM, generator=g).to(device=device, dtype=dtype)
    return q, weights, keys


def _selection(case, device, dtype, kernels):
    _, _, table, page_index, row_req, row_pos, *_ = case
    q, weights, keys = _indexer(case, device, dtype)
    got = kernels.index_scores(q, weights, keys, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5)
    want = ref.index_scores(q, weights, keys, table, page_index, row_req, row_pos, INDEX_DIM ** -0.5)
    return got, want


@pytest.mark.parametrize("entry", ["decode", "extend"])
def test_indexer_scores_and_selection_match_reference(kernels, conformance_device, conformance_dtype, entry):
    make = decode_case if entry == "decode" else extend_case
    case = make(conformance_device, conformance_dtype, heads=64)
    got, want = _selection(case, conformance_device, conformance_dtype, kernels)
    atol, rtol = tolerance(conformance_dtype)
    seen = ~torch.isneginf(want)
    assert seen.any() and (~seen).any(), "the case must have visible and invisible keys"
    assert torch.equal(~torch.isneginf(got), seen) and not torch.isnan(got).any()
    scale = float(want[seen].abs().max())
    torch.testing.assert_close(got[seen], want[seen], atol=atol * scale, rtol=rtol)
    slots, _ = top_k_slots(got, TOPK)
    for row in range(slots.shape[0]):
        chosen = slots[row][slots[row] >= 0].long()
        assert chosen.numel() == min(TOPK, int(seen[row].sum())), f"row {row}: wrong number of keys"
        picked = want[row, chosen]
        assert torch.isfinite(picked).all(), f"row {row} selected an invisible key"
        best = torch.topk(want[row], chosen.numel()).values
        torch.testing.assert_close(picked.sort(descending=True).values, best, atol=atol * scale, rtol=rtol)


@pytest.mark.parametrize("cache", ["element", "scaled_fp8"])
@pytest.mark.parametrize("entry", ["decode", "extend"])
def test_sparse_attention_matches_reference(kernels, conformance_device, conformance_dtype, entry, cache):
    make = decode_case if entry == "decode" else extend_case
    case = make(conformance_device, conformance_dtype, heads=64)
    if cache == "scaled_fp8":
        case = scaled_fp8_case(case, groups=4)
    q, kv_cache, table, page_index, row_req, row_pos, scale, v_dim = case
    scores = ref.index_scores(*_indexer(case, conformance_device, conformance_dtype), table, page_index, row_req,
                              row_pos, INDEX_DIM ** -0.5)
    slots, _ = top_k_slots(scores, TOPK)
    slots[0, 1] = -1  # a gap inside a row's list
    out, lse = kernels.sparse(q, kv_cache, table, row_req, slots, scale, v_dim)
    want_out, want_lse = ref.sparse_attention(q, kv_cache, table, row_req, slots, scale, v_dim)
    atol, rtol = tolerance(conformance_dtype)
    empty = torch.isneginf(want_lse)
    assert (~empty).any(), "no row attends to any key: nothing would be compared"
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert torch.equal(torch.isneginf(lse), empty) and torch.all(out[empty] == 0)
    torch.testing.assert_close(lse[~empty], want_lse[~empty], atol=atol, rtol=rtol)
    torch.testing.assert_close(out.float(), want_out.float(), atol=atol, rtol=rtol)
