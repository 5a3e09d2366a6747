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
