"""Sparse prefill on a scaled-fp8 cache through a copy of its pages in the compute dtype
(:mod:`splash_core.kernels.dsa_dequantized`): the copy holds the cache's values exactly, so the
reference attending over it gives the reference's result on the cache itself, whole or in groups of
requests, and the Triton kernels (interpreter) serve prefill that way within their tolerance."""

from __future__ import annotations

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch

from splash_core.kernels import triton_mla_kernels
from splash_core.kernels.dsa_dequantized import attend_dequantized, prefill_on_dequantized
from splash_core.model.fp8_cache import dequantize, pages_in
from splash_core.model.kv_format import ScaledFP8
from splash_core.reference.dsa import sparse_attention as ref_sparse
from splash_core.testing.mla_inputs import decode_case, extend_case, scaled_fp8_case, tolerance

CPU = torch.device("cpu")


def _case(maker=extend_case, dtype=torch.float16):
    """A scaled-fp8 case and each row's selection: every third visible slot of its request, a
    slot on a hole, -1 pads, and a row selecting nothing."""
    q, cache, table, page_index, row_req, row_pos, scale, v_dim = scaled_fp8_case(
        maker(CPU, dtype, heads=3, dims=(32, 16), page=8), 4)
    width = table.shape[1] * 8
    slots = torch.arange(0, width, 3).expand(q.shape[0], -1).clone()
    slots[:, 1::4] = -1
    slots[0, 0] = int((table[0] < 0).nonzero()[0, 0]) * 8 if (table[0] < 0).any() else slots[0, 0]
    slots[-1] = -1
    return q, cache, table, row_req, slots.int(), scale, v_dim


def _assert_same(got, want):
    (out, lse), (want_out, want_lse) = got, want
    assert torch.isfinite(want_lse).any(), "no row attends to any key: nothing would be compared"
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.float(), want_out.float(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copied_pages_hold_the_caches_values_exactly(dtype):
    q, cache, table, *_ , v_dim = _case()
    layout = ScaledFP8.of_width(cache.shape[2], v_dim, q.shape[2] - v_dim)
    pages, copied = pages_in(cache, table, layout, dtype)
    assert pages.dtype == dtype and copied.shape == table.shape
    assert torch.equal(copied < 0, table < 0)
    held = table >= 0
    want = dequantize(cache[table[held].long()], layout)
    assert torch.equal(pages[copied[held].long()].float(), want.to(dtype).float())
    assert torch.equal(want.to(dtype).float(), want), "the values are not exact in this dtype"


@pytest.mark.parametrize("budget", [1 << 30, 1])
def test_prefill_on_the_copy_is_the_reference_on_the_cache(budget):
    """Whole, and one request at a time (``budget`` 1 byte) with the rows' requests out of order."""
    q, cache, table, row_req, slots, scale, v_dim = _case()
    order = torch.randperm(q.shape[0], generator=torch.Generator().manual_seed(3))
    q, row_req, slots = q[order], row_req[order], slots[order]
    want = ref_sparse(q, cache, table, row_req, slots, scale, v_dim)
    got = attend_dequantized(ref_sparse, q, cache, table, row_req, slots, scale, v_dim, budget=budget)
    _assert_same(got, want)


def test_decode_calls_and_bf16_caches_read_the_cache_as_it_is():
    seen = []

    def spy(q, kv_cache, *args):
        seen.append(kv_cache)
        return ref_sparse(q, kv_cache, *args)

    sparse = prefill_on_dequantized(spy)
    q, cache, table, row_req, slots, scale, v_dim = _case(decode_case)
    sparse(q, cache, table, row_req, slots, scale, v_dim)
    assert seen[-1] is cache  # a row per request: each key gathered once, from the fp8 cache
    q, cache, table, row_req, slots, scale, v_dim = _case()
    sparse(q, cache, table, row_req, slots, scale, v_dim)
    assert seen[-1].dtype == q.dtype and seen[-1] is not cache
    plain = extend_case(CPU, torch.float16, heads=3, dims=(32, 16), page=8)[1]
    sparse(q, plain, table, row_req, slots, scale, v_dim)
    assert seen[-1] is plain


def test_triton_prefill_on_a_scaled_cache_matches_the_reference():
    q, cache, table, row_req, slots, scale, v_dim = _case()
    got = triton_mla_kernels().sparse(q, cache, table, row_req, slots, scale, v_dim)
    (out, lse), (want_out, want_lse) = got, ref_sparse(q, cache, table, row_req, slots, scale, v_dim)
    atol, rtol = tolerance(q.dtype)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse)) and torch.isfinite(want_lse).any()
    torch.testing.assert_close(out.float(), want_out.float(), atol=atol, rtol=rtol)


def test_checks_fail_on_planted_faults():
    """A copy listed under the wrong table entries, a NaN, and a call where no row attends fail."""
    q, cache, table, row_req, slots, scale, v_dim = _case()
    want = ref_sparse(q, cache, table, row_req, slots, scale, v_dim)

    def misplaced(q, pages, copied, *args):
        return ref_sparse(q, pages, torch.where(copied >= 0, copied.roll(1), -1), *args)

    with pytest.raises(AssertionError):
        _assert_same(attend_dequantized(misplaced, q, cache, table, row_req, slots, scale, v_dim), want)
    out, lse = attend_dequantized(ref_sparse, q, cache, table, row_req, slots, scale, v_dim)
    out[0, 0, 0] = float("nan")
    with pytest.raises(AssertionError):
        _assert_same((out, lse), want)
    none = torch.full_like(slots, -1)
    with pytest.raises(AssertionError, match="no row attends"):
        _assert_same(attend_dequantized(ref_sparse, q, cache, table, row_req, none, scale, v_dim),
                     ref_sparse(q, cache, table, row_req, none, scale, v_dim))
