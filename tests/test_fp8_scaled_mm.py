"""torch's block-scaled ``scaled_mm`` provider of FP8 GEMMs (``kernels/fp8_scaled_mm.py``): the
argument layouts it builds (outer-dim-major token scales, 128 x 128 scales padded to four column
blocks and transposed, rows padded to 16), read by :func:`emulate` as torch's recipe reads them,
give the dequantized spec's ``y = x W^T`` on ragged row counts and a column-block count that is no
multiple of four; scales as stored or with their row blocks swapped (planted layout faults) do not. On this CPU torch refuses
block scales, and ``available`` says so. The GPU run is the conformance suite's (hopper backend)."""

from __future__ import annotations

import pytest
import torch

from splash_core.checkpoint import fp8
from splash_core.kernels import fp8_scaled_mm
from splash_core.kernels.fp8_scaled_mm import emulate, fits, operands, scaled_mm_linear
from splash_core.model.fp8_blocks import BlockScaledFP8, gemm_mismatch, quantize_tokens, reference_gemm, slice_of

TOLERANCE = 1e-5  # float32 output: summation order only


def _weight(n: int, k: int, seed: int = 0) -> BlockScaledFP8:
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(n, k, generator=g) * torch.linspace(0.1, 4, k // 128).repeat_interleave(128)
    return BlockScaledFP8(*fp8.quantize(full))


@pytest.mark.parametrize("m", [1, 16, 37])
def test_layouts_give_the_spec(m):
    w = _weight(256, 640)  # 5 column blocks: the scales are padded to 8
    x = torch.randn(m, 640, generator=torch.Generator().manual_seed(m)) * 3
    got = scaled_mm_linear(quantize_tokens, emulate)(x, w)
    want = reference_gemm(quantize_tokens(x), w)
    assert got.shape == (m, 256)
    assert gemm_mismatch(got, want, TOLERANCE) == ""


def test_misplaced_weight_scales_are_caught():
    w = _weight(256, 512, seed=1)
    x = torch.randn(32, 512)
    a, b, scale_a, _ = operands(quantize_tokens(x), w)
    with pytest.raises(ValueError, match="scale_b"):
        emulate(a, b, scale_a, w.scales, torch.float32)  # as stored, not padded and transposed
    want = reference_gemm(quantize_tokens(x), w)
    swapped = fp8_scaled_mm.weight_scales(BlockScaledFP8(w.codes, w.scales.flip(0)))  # row blocks' scales swapped
    assert gemm_mismatch(emulate(a, b, scale_a, swapped, torch.float32), want, TOLERANCE) != ""


def test_only_whole_blocks_fit():
    codes, scales = fp8.quantize(torch.randn(384, 512))
    assert fits(BlockScaledFP8(codes, scales))
    assert not fits(slice_of(codes, scales, slice(8, 264), slice(None)))  # starts mid-block
    assert not fits(slice_of(codes, scales, slice(0, 200), slice(None)))  # a partial row block
    assert not fits(BlockScaledFP8(codes[None], scales[None]))  # experts stacked
    with pytest.raises(ValueError, match="whole 128-blocks"):
        operands(quantize_tokens(torch.randn(16, 512)), slice_of(codes, scales, slice(0, 200), slice(None)))


def test_cpu_torch_says_why_it_cannot():
    assert fp8_scaled_mm.available("cpu") != ""


def test_weight_scales_are_made_once_per_weight_and_dropped_with_it():
    w = _weight(256, 512)
    first = fp8_scaled_mm.weight_scales(w)
    assert fp8_scaled_mm.weight_scales(w) is first and first.shape == (4, 2) and first.stride() == (1, 4)
    other = _weight(256, 512, seed=3)
    assert fp8_scaled_mm.weight_scales(other) is not first
    key = id(w.scales)
    del w, first
    import gc
    gc.collect()
    assert key not in fp8_scaled_mm._WEIGHT_SCALES
