"""Which kernel serves an FP8 GEMM on the hopper backend: torch's block-scaled ``scaled_mm`` from the
measured row count (``fp8_linear`` entry of its table) on whole-block weights, Triton for fewer rows,
mid-block slices and experts, and Triton alone where nothing was measured or torch cannot (this CPU)."""

from __future__ import annotations

import torch
from splash_backend_hopper import fp8_linear, providers

from splash_core.checkpoint import fp8
from splash_core.model.fp8_blocks import BlockScaledFP8, slice_of

TABLE = {"fp8_linear": {"scaled_mm_from_rows": 64}}


def test_routing_by_rows_and_blocks(monkeypatch):
    calls = []
    monkeypatch.setattr(fp8_linear, "_unavailable", lambda device: "")
    monkeypatch.setattr(fp8_linear, "scaled_mm_linear", lambda quantize: lambda x, w: calls.append(x.shape[0]) or "cublas")
    kernels = fp8_linear.kernels("cuda", TABLE)
    assert [name for name, _ in kernels.providers] == ["triton", "scaled_mm"]
    codes, scales = fp8.quantize(torch.randn(256, 256))
    whole = BlockScaledFP8(codes, scales)
    assert kernels.linear(torch.randn(64, 256), whole) == "cublas"
    assert calls == [64]
    routed_to_triton = [kernels.linear(torch.randn(m, w.shape[1]), w)
                        for m, w in ((16, whole), (64, slice_of(codes, scales, slice(8, 200), slice(None))))]
    assert all(isinstance(y, torch.Tensor) for y in routed_to_triton) and calls == [64]
    unmeasured = fp8_linear.kernels("cuda", {})
    assert "not measured" in unmeasured.name and len(unmeasured.providers) == 2


def test_cpu_gets_triton_alone():
    kernels = fp8_linear.kernels("cpu", TABLE)
    assert kernels.name == "triton" and kernels.providers == ()
    assert providers.scaled_mm_from_rows(TABLE) == 64 and providers.scaled_mm_from_rows({}) is None
    assert "scaled_mm from 64 rows" in providers.describe_fp8_linear(TABLE)


TILED = {"fp8_tiles": {"weights": {"96x256": {"16": [16, 32, 1, 1, 1, 1], "64": [16, 32, 1, 1, 2, 0]}}}}


def test_measured_tiles_by_weight_shape_and_rows(monkeypatch):
    """``fp8_tiles``: a weight [n, k] computes in the tile measured at the fewest measured rows that
    hold its batch; other shapes and larger batches keep the portable tile; the outputs are the spec's."""
    tile = fp8_linear.measured_tiles(TILED)
    assert tile(1, 96, 256).swap and tile(16, 96, 256).swap
    assert tile(17, 96, 256).split_k == 2 and not tile(64, 96, 256).swap
    assert tile(65, 96, 256) is None and tile(16, 96, 128) is None and fp8_linear.measured_tiles({}) is None
    assert "1 weight shapes with measured tiles" in providers.describe_fp8_linear({**TABLE, **TILED})
    used = []
    real = fp8_linear.triton_fp8_linear_kernels.__globals__["fp8_block_gemm"]

    def spy(x, w, out_dtype, tile=None):
        used.append(tile)
        return real(x, w, out_dtype, tile)

    monkeypatch.setitem(fp8_linear.triton_fp8_linear_kernels.__globals__, "fp8_block_gemm", spy)
    kernels = fp8_linear.kernels("cpu", TILED)
    assert kernels.name == "triton (measured tiles)"
    codes, scales = fp8.quantize(torch.randn(96, 256))
    w = BlockScaledFP8(codes, scales)
    x = torch.randn(5, 256)
    got = kernels.linear(x, w)
    assert used[-1].swap and torch.allclose(got, fp8_linear.triton_fp8_linear_kernels().linear(x, w), atol=1e-5)
    kernels.linear(torch.randn(100, 256), w)
    assert used[-1] is None  # past the measured rows: portable
