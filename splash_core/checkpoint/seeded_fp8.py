"""Seeded weights kept as an FP8 checkpoint would store them, so a deployment without a checkpoint
folder can hold its feed-forward weights FP8 (``ffn_weights: fp8``; issue 38).

Every tensor DeepSeek stores FP8 (a layer's 2-D projection weights: attention, dense MLP, routed
and shared experts; not the embedding, LM head, router, norms, biases or the DSA indexer's
``weights_proj``) is drawn as :class:`~splash_core.model.weights.SeededWeights` draws it, then
quantized into e4m3 codes with one float32 scale per 128 x 128 block (:func:`.fp8.quantize`, the
writer's quantizer). ``get`` returns those codes dequantized, so the reference check and a run
holding the weights in the compute format compute with exactly the values the FP8 run holds;
``get_block_scaled`` hands out the codes and scales of a slice as
:class:`~.source.CheckpointWeights` does (a slice may start inside a block).
"""

from __future__ import annotations

import torch

from ..model.fp8_blocks import BLOCK, BlockScaledFP8, slice_of
from ..model.weights import SeededWeights
from . import fp8


class SeededFP8Weights(SeededWeights):
    """:class:`SeededWeights` whose projection weights are kept FP8 block-scaled (``block`` rows x cols)."""

    def __init__(self, seed: int = 0, block: tuple[int, int] = (BLOCK, BLOCK)):
        super().__init__(seed)
        self.block = tuple(block)

    def _stored(self, name, shape, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole tensor's e4m3 codes and its block scales, on ``device``."""
        return fp8.quantize(super().get(name, shape, device=device), self.block)

    def get(self, name, shape, *, rows=None, cols=None, device=None, dtype=None):
        if not (len(shape) == 2 and fp8.stored_fp8(name)):
            return super().get(name, shape, rows=rows, cols=cols, device=device, dtype=dtype)
        kept = self.get_block_scaled(name, shape, rows=rows, cols=cols, device=device)
        return kept.dequantize().to(dtype or torch.float32).contiguous()

    def get_block_scaled(self, name, shape, *, rows=None, cols=None, device=None) -> BlockScaledFP8:
        """``name``'s slice [rows, cols] as e4m3 codes and the scale blocks that cover it; ValueError
        for a tensor an FP8 checkpoint does not store FP8."""
        if not (len(shape) == 2 and fp8.stored_fp8(name)):
            raise ValueError(f"{name}: not stored FP8 block-scaled (an FP8 checkpoint keeps it in bf16/fp32)")
        codes, scales = self._stored(name, shape, torch.device(device or "cpu"))
        part = slice_of(codes, scales, rows or slice(None), cols or slice(None), self.block)
        # copies: a slice must not keep the whole tensor's codes alive
        return BlockScaledFP8(part.codes.clone(), part.scales.clone(), part.start, part.block)
