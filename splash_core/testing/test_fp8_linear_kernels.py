"""The backend's FP8 GEMMs (``splash_fp8_linear_kernels``) match the W8A8 spec of
:mod:`splash_core.model.fp8_blocks` (activations quantized per token group, then the dequantized
operands multiplied in float32), for a weight slice starting inside its blocks and for experts
with uneven and empty row groups (the reference backend: its torch spec). Skipped for a backend without
them (it dequantizes instead)."""

from __future__ import annotations

import pytest
import torch

from splash_core.checkpoint import fp8
from splash_core.model.fp8_blocks import BlockScaledFP8, gemm_mismatch, quantize_tokens, reference_gemm, slice_of


@pytest.fixture(scope="module")
def fp8_kernels(conformance_backend, conformance_device, conformance_dtype):
    kernels = conformance_backend.fp8_linear_kernels(conformance_device, conformance_dtype)
    if kernels is None:
        pytest.skip(f"backend {conformance_backend.name} has no FP8 GEMMs (FP8 weights are dequantized at each use)")
    return kernels


def _tolerance(dtype) -> float:
    # the spec's float32 result rounded to the output format, plus float32 summation order
    return 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps


def _weights(shape, experts, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes, scales = zip(*(fp8.quantize(torch.randn(*shape, generator=g)) for _ in range(experts)))
    return torch.stack(codes).to(device), torch.stack(scales).to(device), g


def test_linear_matches_the_spec_on_a_slice_starting_mid_block(fp8_kernels, conformance_device, conformance_dtype):
    codes, scales, g = _weights((300, 400), 1, conformance_device)
    w = slice_of(codes[0], scales[0], slice(70, 250), slice(100, 330))
    x = (torch.randn(9, w.shape[1], generator=g) * 3).to(conformance_device, conformance_dtype)
    got = fp8_kernels.linear(x, w)
    want = reference_gemm(quantize_tokens(x, start=w.start[1]), w)
    assert got.dtype == conformance_dtype
    problem = gemm_mismatch(got.float(), want, _tolerance(conformance_dtype))
    assert problem == "", f"{fp8_kernels.name} linear: {problem}"


def test_grouped_matches_the_spec_per_expert(fp8_kernels, conformance_device, conformance_dtype):
    codes, scales, g = _weights((200, 300), 3, conformance_device, seed=1)
    w = BlockScaledFP8(codes, scales)
    counts = torch.tensor([5, 0, 7], device=conformance_device)
    x = torch.randn(15, 300, generator=g).to(conformance_device, conformance_dtype)  # the last 3 rows: no expert's
    got = fp8_kernels.grouped(x, w, counts)
    assert got.shape == (15, 200) and got.dtype == conformance_dtype
    start = 0
    for e, n in enumerate(counts.tolist()):
        want = reference_gemm(quantize_tokens(x[start: start + n]), w.expert(e))
        if n:
            problem = gemm_mismatch(got[start: start + n].float(), want, _tolerance(conformance_dtype))
            assert problem == "", f"{fp8_kernels.name} grouped, expert {e}: {problem}"
        start += n


@pytest.mark.parametrize("rows", [7, 64])
def test_every_linear_provider_matches_the_spec_on_whole_blocks(fp8_kernels, conformance_device, conformance_dtype,
                                                                rows):
    codes, scales, g = _weights((256, 640), 1, conformance_device, seed=2)  # 5 column blocks, rows not x16
    w = BlockScaledFP8(codes[0], scales[0])
    x = (torch.randn(rows, 640, generator=g) * 3).to(conformance_device, conformance_dtype)
    want = reference_gemm(quantize_tokens(x), w)
    for name, linear in fp8_kernels.providers or ((fp8_kernels.name, fp8_kernels.linear),):
        got = linear(x, w)
        assert got.shape == (rows, 256) and got.dtype == conformance_dtype, name
        problem = gemm_mismatch(got.float(), want, _tolerance(conformance_dtype))
        assert problem == "", f"{name} linear: {problem}"
