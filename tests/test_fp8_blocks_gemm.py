"""The FP8 block GEMM (1 x 128 token-group activations times 128 x 128 block-scaled weights) in
Triton's interpreter against the spec (dequantize, then a float32 matmul), on small shapes with
slices starting mid-block and partial edge blocks, plain and per expert; and the spec's own error
(activation quantization) measured against float32 activations within e4m3's bound.

Tolerances are measured, not guessed: the w8a8 spec differs from ``x W^T`` by at most 2**-4 of
``|x| |W|^T`` (e4m3's relative rounding of each activation), and the kernel from the spec by float32
summation order only. Each check is shown to fail on NaN and on a wrong scale block."""

from __future__ import annotations

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch

from splash_core.checkpoint import fp8
from splash_core.kernels.fp8_block_gemm import GemmTile, fp8_block_gemm, grouped_fp8_block_gemm, quantize_token_groups
from splash_core.model.fp8_blocks import BlockScaledFP8, gemm_mismatch, quantize_tokens, reference_gemm, slice_of

KERNEL_TOL = 1e-5  # float32 accumulation in another order; measured ~5e-7 on these shapes
SMALL = GemmTile(16, 32, 1, 1)  # the interpreter's cost grows with the tile


def _case(rows, cols, m, seed=0, full=(300, 400)):
    g = torch.Generator().manual_seed(seed)
    codes, scales = fp8.quantize(torch.randn(*full, generator=g))
    w = slice_of(codes, scales, rows, cols)
    x = torch.randn(m, w.shape[1], generator=g) * torch.rand(m, 1, generator=g)
    return x, quantize_tokens(x, start=w.start[1]), w


SLICES = {
    "aligned": (slice(0, 256), slice(0, 256)),
    "mid-block starts, partial edges": (slice(70, 250), slice(100, 330)),
    "inside one block": (slice(5, 40), slice(130, 200)),
    "whole, partial last blocks": (slice(0, 300), slice(0, 400)),
}


@pytest.mark.parametrize("name", SLICES)
@pytest.mark.parametrize("m", [1, 19])
def test_the_kernel_computes_the_spec(name, m):
    x, xq, w = _case(*SLICES[name], m)
    want = reference_gemm(xq, w)
    got = fp8_block_gemm(xq, w, torch.float32, SMALL)
    assert gemm_mismatch(got, want, KERNEL_TOL) == ""
    # The spec's own error, activation quantization, is within e4m3's bound elementwise.
    exact = x @ w.dequantize().T
    bound = 2 ** -4 * (x.abs() @ w.dequantize().abs().T) + 1e-6
    assert bool(((want - exact).abs() <= bound).all())


@pytest.mark.parametrize("split_k", [2, 3, 8])
def test_split_column_blocks_add_up_to_the_spec(split_k):
    _, xq, w = _case(*SLICES["whole, partial last blocks"], 5)  # 4 column blocks, the last partial
    got = fp8_block_gemm(xq, w, torch.float32, GemmTile(16, 32, 1, 1, split_k))
    assert gemm_mismatch(got, reference_gemm(xq, w), KERNEL_TOL) == ""


SWAPPED = GemmTile(16, 32, 1, 1, swap=True)  # the batch as the MMA's columns


@pytest.mark.parametrize("name", SLICES)
@pytest.mark.parametrize("split_k", [1, 3])
def test_the_swapped_tile_computes_the_spec(name, split_k):
    """y^T = W x^T tiles (the weight's rows on the long side of the MMA) give the spec's rows and
    columns, edges, mid-block starts and split column blocks included; a wrong scale block shows."""
    _, xq, w = _case(*SLICES[name], 19)
    want = reference_gemm(xq, w)
    tile = GemmTile(16, 32, 1, 1, split_k, swap=True)
    assert gemm_mismatch(fp8_block_gemm(xq, w, torch.float32, tile), want, KERNEL_TOL) == ""
    wrong = w.scales.clone()
    wrong[-1, -1] *= 1.5
    got = fp8_block_gemm(xq, BlockScaledFP8(w.codes, wrong, w.start), torch.float32, tile)
    assert "above" in gemm_mismatch(got, want, KERNEL_TOL)


def test_the_default_tile_and_fp16_output():
    _, xq, w = _case(*SLICES["mid-block starts, partial edges"], 20)
    got = fp8_block_gemm(xq, w, torch.float16)
    assert got.dtype == torch.float16
    assert gemm_mismatch(got, reference_gemm(xq, w), 2 ** -10) == ""


def test_the_check_fails_on_a_wrong_scale_block_and_on_nan():
    x, xq, w = _case(*SLICES["mid-block starts, partial edges"], 19)
    want = reference_gemm(xq, w)
    wrong = w.scales.clone()
    wrong[1, 1] *= 1.5
    got = fp8_block_gemm(xq, BlockScaledFP8(w.codes, wrong, w.start), torch.float32, SMALL)
    assert "above" in gemm_mismatch(got, want, KERNEL_TOL)
    shifted = BlockScaledFP8(w.codes, w.scales, (w.start[0] - 1, w.start[1]))  # rows read the wrong scale row
    assert "above" in gemm_mismatch(fp8_block_gemm(xq, shifted, torch.float32, SMALL), want, KERNEL_TOL)
    nan = w.scales.clone()
    nan[0, 2] = float("nan")
    got = fp8_block_gemm(xq, BlockScaledFP8(w.codes, nan, w.start), torch.float32, SMALL)
    assert "not finite" in gemm_mismatch(got, want, KERNEL_TOL)


def test_empty_batches_and_mismatched_groups():
    _, xq, w = _case(*SLICES["inside one block"], 0)
    assert fp8_block_gemm(xq, w, torch.float32).shape == (0, 35)
    _, _, w = _case(*SLICES["mid-block starts, partial edges"], 3)
    with pytest.raises(ValueError, match="do not match"):
        fp8_block_gemm(quantize_tokens(torch.randn(3, w.shape[1])), w)  # groups from 0, blocks from 100


def test_the_grouped_kernel_computes_each_experts_rows():
    g = torch.Generator().manual_seed(3)
    experts = [fp8.quantize(torch.randn(200, 300, generator=g)) for _ in range(3)]
    rows, cols = slice(50, 150), slice(40, 300)  # every expert's slice starts mid-block
    parts = [slice_of(c, s, rows, cols) for c, s in experts]
    w = BlockScaledFP8(torch.stack([p.codes for p in parts]), torch.stack([p.scales for p in parts]), parts[0].start)
    offsets = torch.tensor([0, 5, 5, 17])  # the second expert has no rows
    xq = quantize_tokens(torch.randn(17, 260, generator=g), start=40)
    got = grouped_fp8_block_gemm(xq, w, offsets, torch.float32, SMALL)
    want = torch.cat([reference_gemm(type(xq)(xq.codes[a:b], xq.scales[a:b], 40), w.expert(e))
                      for e, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist()))])
    assert gemm_mismatch(got, want, KERNEL_TOL) == ""
    bounded = grouped_fp8_block_gemm(xq, w, offsets, torch.float32, GemmTile(16, 32, 1, 1, 2), max_rows=12)
    assert gemm_mismatch(bounded, want, KERNEL_TOL) == ""
    swapped = grouped_fp8_block_gemm(xq, w, offsets, torch.float32, SWAPPED, max_rows=12)
    assert gemm_mismatch(swapped, want, KERNEL_TOL) == ""
    with pytest.raises(ValueError, match="E \\+ 1 offsets"):
        grouped_fp8_block_gemm(xq, w, offsets[:3])


@pytest.mark.parametrize("start, k", [(0, 256), (100, 300), (5, 40), (0, 1100)])
def test_activations_quantize_as_the_reference_bit_for_bit(start, k):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, k, generator=g) * torch.logspace(-8, 3, 7)[:, None]  # subnormal codes too
    x[2, : 128 - start] = 0.0  # an all-zero first group
    for inp in (x, x.half(), torch.randn(7, k + 3, generator=g)[:, 3:]):  # fp16, strided rows
        got, want = quantize_token_groups(inp, start), quantize_tokens(inp, start)
        assert torch.equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8))
        assert torch.equal(got.scales, want.scales)


def test_a_nan_activation_reaches_the_output():
    x, _, w = _case(*SLICES["mid-block starts, partial edges"], 4)
    x[1, 50] = float("nan")
    xq = quantize_token_groups(x, w.start[1])
    assert bool(xq.scales[1].isnan().any()) and not bool(xq.scales[[0, 2, 3]].isnan().any())
    got = fp8_block_gemm(xq, w, torch.float32, SMALL)
    assert "not finite at (1, 0)" in gemm_mismatch(got, reference_gemm(quantize_tokens(x.nan_to_num(), 100), w), 1.0)
