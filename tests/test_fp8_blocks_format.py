"""FP8 block-scaled weights kept as stored: the slice type's dequantization (the spec) against the
checkpoint's dequantize-at-load path, token-group activations, the mismatch check (it fails on
NaN/inf, empty output and a planted wrong scale block), and the loader that reads a rank's slice
of a safetensors file without dequantizing (shards starting mid-block, partial edge blocks)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from splash_core.checkpoint import fp8
from splash_core.checkpoint.fp8_blocks import read_block_scaled_file
from splash_core.model.fp8_blocks import (E4M3_MAX, BlockScaledFP8, TokenGroupsFP8, gemm_mismatch, quantize_tokens,
                                          reference_gemm, relative_error, slice_of)
from splash_core.profiles.checkpoint_family import CheckpointError

ROWS, COLS = 2112, 320  # DeepSeek's fused q_a + kv_a rows (1536 + 576): a TP = 8 shard is 264 rows, not 128-aligned


def _weight(rows=ROWS, cols=COLS, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g)  # rows of different ranges
    return w, *fp8.quantize(w)


def _shards(size, parts):
    step = size // parts
    return [slice(r * step, (r + 1) * step) for r in range(parts)]


def test_slices_dequantize_as_the_checkpoint_path_does():
    w, codes, scales = _weight()
    for rows in _shards(ROWS, 8):
        for cols in (slice(0, COLS), slice(100, 300), slice(130, 131)):
            part = slice_of(codes, scales, rows, cols)
            assert part.start == (rows.start % 128, cols.start % 128)
            old = fp8.dequantize(codes[rows, cols], scales[fp8.scale_rows(rows, 128), fp8.scale_rows(cols, 128)],
                                 rows, cols, (128, 128))
            assert torch.equal(part.dequantize(), old)
            assert part.stored_bytes == part.codes.numel() + 4 * part.scales.numel()
    whole = slice_of(codes, scales, slice(None), slice(None))
    assert relative_error(whole.dequantize(), w) < 2 ** -4  # e4m3 keeps 3 mantissa bits


def test_the_slice_type_refuses_what_does_not_describe_a_slice():
    _, codes, scales = _weight(300, 200)
    with pytest.raises(ValueError, match="not the \\[2, 1\\] blocks"):
        BlockScaledFP8(codes[:200, :100], scales, (0, 0))  # the whole grid for a part of it
    with pytest.raises(ValueError, match="not inside"):
        BlockScaledFP8(codes[:10, :10], scales[:1, :1], (128, 0))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        BlockScaledFP8(codes[:10, :10].float(), scales[:1, :1])
    with pytest.raises(ValueError, match="increasing runs"):
        slice_of(codes, scales, slice(0, 10, 2), slice(None))


def test_rotary_rows_reorder_inside_their_blocks():
    _, codes, scales = _weight(576, 256)  # KV-A: 512 latent rows, then 64 rotary rows inside block 4
    part = slice_of(codes, scales, slice(None), slice(None))
    order = torch.arange(576)
    order[512:] = 512 + torch.cat([torch.arange(0, 64, 2), torch.arange(1, 64, 2)])
    moved = part.rows_reordered(order)
    assert torch.equal(moved.dequantize(), part.dequantize()[order])
    across = torch.arange(576)
    across[[100, 200]] = across[[200, 100]]
    with pytest.raises(ValueError, match="across 128-row scale blocks"):
        part.rows_reordered(across)


def test_token_groups_follow_the_weight_blocks():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 300, generator=g)
    x[:, 28] = 1000.0  # channel 28 is the first of the second group when the slice starts 100 into a block
    q = quantize_tokens(x, start=100)
    assert q.scales.shape == (5, 4)
    assert torch.allclose(q.scales[:, 1], torch.full((5,), 1000.0 / E4M3_MAX))
    assert float(q.scales[:, 0].max()) < 10.0 / E4M3_MAX  # the outlier did not widen the short first group
    error = (q.dequantize() - x).abs() / torch.repeat_interleave(q.scales * E4M3_MAX, 128, dim=1)[:, 100:400]
    assert float(error.max()) <= 2 ** -4
    with pytest.raises(ValueError, match="scales must be float32"):
        TokenGroupsFP8(q.codes, q.scales[:, :3], 100)


def test_the_mismatch_check_fails_on_nan_inf_empty_and_a_wrong_scale_block():
    _, codes, scales = _weight(300, 260)
    w = slice_of(codes, scales, slice(70, 250), slice(3, 260))
    x = quantize_tokens(torch.randn(9, w.shape[1], generator=torch.Generator().manual_seed(2)), start=3)
    want = reference_gemm(x, w)
    assert gemm_mismatch(want.clone(), want, 0.0) == ""
    for bad in (float("nan"), float("inf")):
        got = want.clone()
        got[4, 7] = bad
        assert "not finite at (4, 7)" in gemm_mismatch(got, want, 1.0)
    assert gemm_mismatch(want[:0], want[:0], 1.0) == "empty output"
    assert "shape" in gemm_mismatch(want[:, :5], want, 1.0)
    wrong = w.scales.clone()
    wrong[1, 2] *= 2  # one scale block read from the wrong place
    faulty = reference_gemm(x, BlockScaledFP8(w.codes, wrong, w.start))
    assert "above" in gemm_mismatch(faulty, want, 1e-3)
    with pytest.raises(ValueError, match="do not match"):
        reference_gemm(quantize_tokens(torch.randn(9, w.shape[1])), w)  # groups not following the blocks


@pytest.fixture
def stored(tmp_path):
    _, codes, scales = _weight()
    file = tmp_path / "model.safetensors"
    save_file({"q_a.weight": codes, "q_a.weight_scale_inv": scales, "norm.weight": torch.ones(8),
               "bad.weight": codes[:, :10].contiguous(), "bad.weight_scale_inv": scales.clone()}, str(file))
    return file, codes, scales


def test_a_rank_reads_its_slice_as_stored(stored):
    file, codes, scales = stored
    for rows, cols in [*((r, slice(None)) for r in _shards(ROWS, 8)), (slice(264, 528), slice(100, 300))]:
        got = read_block_scaled_file(file, "q_a.weight", rows, cols)
        want = slice_of(codes, scales, rows, cols)
        assert got.start == want.start
        assert torch.equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8))
        assert torch.equal(got.scales, want.scales)
    shard = read_block_scaled_file(file, "q_a.weight", slice(264, 528))
    assert shard.scales.shape == (3, 3)  # rows 264..527 touch blocks 2, 3 and 4
    assert shard.stored_bytes == 264 * COLS + 4 * 9


@pytest.mark.parametrize("name, rows, why", [
    ("missing.weight", None, "missing"), ("norm.weight", None, "not a 2-D FP8"),
    ("bad.weight", None, "not the float32 128x128 block grid"), ("q_a.weight", slice(0, 100, 2), "step 1")])
def test_the_loader_refuses_by_name(stored, name, rows, why):
    file, _, _ = stored
    with pytest.raises(CheckpointError, match=why) as raised:
        read_block_scaled_file(file, name, rows)
    assert name in str(raised.value) or "scale_inv" in str(raised.value)


def test_the_loader_refuses_a_weight_without_scales(tmp_path):
    _, codes, _ = _weight(128, 128)
    save_file({"w.weight": codes}, str(tmp_path / "a.safetensors"))
    with pytest.raises(CheckpointError, match="without w.weight_scale_inv"):
        read_block_scaled_file(tmp_path / "a.safetensors", "w.weight")
    (tmp_path / "b.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        read_block_scaled_file(tmp_path / "b.safetensors", "w.weight")
