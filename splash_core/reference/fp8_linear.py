"""Torch reference of the FP8 GEMMs (the spec in :class:`splash_core.platform.interfaces.FP8LinearKernels`):
activations quantized per token group (:func:`~splash_core.model.fp8_blocks.quantize_tokens`),
then the dequantized operands multiplied in float32 (:func:`~splash_core.model.fp8_blocks.reference_gemm`)
and rounded to the activations' format. One expert at a time for the grouped form."""

from __future__ import annotations

import torch

from ..model.fp8_blocks import BlockScaledFP8, quantize_tokens, reference_gemm
from ..platform.interfaces import FP8LinearKernels


def linear(x: torch.Tensor, w: BlockScaledFP8) -> torch.Tensor:
    return reference_gemm(quantize_tokens(x, w.start[1], w.block[1]), w).to(x.dtype)


def grouped(x: torch.Tensor, w: BlockScaledFP8, counts: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros(x.shape[0], w.shape[-2])
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            out[start:start + n] = linear(x[start:start + n], w.expert(e))
        start += n
    return out


KERNELS = FP8LinearKernels(linear=linear, grouped=grouped, name="reference")
