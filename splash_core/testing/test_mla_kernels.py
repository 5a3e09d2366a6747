"""The backend's MLA kernels match the torch reference (:mod:`splash_core.reference.mla`; the
expanded form's, where the backend has one, :mod:`splash_core.reference.expanded`) within a
tolerance set by the compute dtype, at MLA's real channel dims (d_c 512, d_r 64; d_n = d_v = 128),
on element caches and on DeepSeek-V3.2's scaled-fp8 cache (uint8, 656 bytes a token)."""

from __future__ import annotations

import pytest
import torch

from splash_core.kernels.expanded_choice import ExpandedChoice
from splash_core.reference import mla as ref
from splash_core.reference.expanded import expanded_attention

from .mla_inputs import decode_case, expanded_case, extend_case, scaled_fp8_case, tolerance


@pytest.fixture(scope="module")
def kernels(conformance_backend, conformance_device, conformance_dtype):
    return conformance_backend.mla_kernels(conformance_device, conformance_dtype)


def _assert_matches(got, want, dtype, what):
    (out, lse), (ref_out, ref_lse) = got, want
    atol, rtol = tolerance(dtype)
    assert out.dtype == ref_out.dtype and lse.dtype == torch.float32, what
    empty = torch.isneginf(ref_lse)
    assert not bool(empty.all()), f"{what}: the case has no row that sees a key (it would compare nothing)"
    assert torch.equal(torch.isneginf(lse), empty), f"{what}: rows without visible keys differ"
    assert torch.all(out[empty] == 0), f"{what}: rows without visible keys must give 0"
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=atol, rtol=rtol, msg=lambda m: f"{what} lse: {m}")
    torch.testing.assert_close(out.float(), ref_out.float(), atol=atol, rtol=rtol, msg=lambda m: f"{what} out: {m}")


def test_decode_matches_reference(kernels, conformance_device, conformance_dtype):
    case = decode_case(conformance_device, conformance_dtype)
    _assert_matches(kernels.decode(*case), ref.attention(*case), conformance_dtype, "decode")


def test_extend_matches_reference(kernels, conformance_device, conformance_dtype):
    case = extend_case(conformance_device, conformance_dtype)
    _assert_matches(kernels.extend(*case), ref.attention(*case), conformance_dtype, "extend")


@pytest.mark.parametrize("entry", ["decode", "extend"])
def test_scaled_fp8_cache_matches_reference(kernels, conformance_device, conformance_dtype, entry):
    make = decode_case if entry == "decode" else extend_case
    case = scaled_fp8_case(make(conformance_device, conformance_dtype), groups=4)
    _assert_matches(getattr(kernels, entry)(*case), ref.attention(*case), conformance_dtype, f"fp8 {entry}")


def test_expanded_matches_reference(kernels, conformance_device, conformance_dtype):
    """Where the backend chooses among expanded providers per call (e.g. torch's SDPA kernels by a
    measured table), every one of them, not only the one the case's shape picks."""
    if kernels.expanded is None:
        pytest.skip(f"{kernels.name} has no expanded-form kernel (prefill attends absorbed)")
    case = expanded_case(conformance_device, conformance_dtype)
    chosen = kernels.expanded
    for name, provider in chosen.providers if isinstance(chosen, ExpandedChoice) else (("", chosen),):
        _assert_matches(provider(*case), expanded_attention(*case), conformance_dtype, f"expanded {name}".rstrip())


def test_merge_matches_reference(kernels, conformance_device, conformance_dtype):
    g = torch.Generator().manual_seed(3)
    outs = torch.randn(3, 5, 4, 512, generator=g).to(device=conformance_device, dtype=conformance_dtype)
    lses = torch.randn(3, 5, 4, generator=g).to(conformance_device)
    lses[:, 0, 0] = float("-inf")  # a row no part saw
    lses[1, 2, :] = float("-inf")  # one empty part among others
    _assert_matches(kernels.merge(outs, lses), ref.merge(outs, lses), conformance_dtype, "merge")


def test_pack_unpack_move_pages_exactly(kernels, conformance_device, conformance_dtype):
    g = torch.Generator().manual_seed(4)
    cache = torch.randn(9, 16, 576, generator=g).to(device=conformance_device, dtype=conformance_dtype)
    pages = torch.tensor([7, 0, 3], device=conformance_device)
    buf = kernels.pack(cache, pages)
    assert torch.equal(buf, ref.pack(cache, pages))
    target = torch.zeros_like(cache)
    kernels.unpack(target, torch.tensor([1, 8, 2], device=conformance_device), buf)
    assert torch.equal(target[[1, 8, 2]], buf) and torch.all(target[[0, 3, 4, 5, 6, 7]] == 0)
