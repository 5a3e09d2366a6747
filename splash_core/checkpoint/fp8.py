"""Block-scaled FP8 weights as DeepSeek-V3 checkpoints store them.

A quantized ``nn.Linear`` weight ``W`` [out, in] is stored as ``{name}.weight`` in
``float8_e4m3fn`` and ``{name}.weight_scale_inv`` [ceil(out / b0), ceil(in / b1)] float32: block
(i, j) of the weight (b0 x b1 elements, ``quantization_config.weight_block_size``, 128 x 128 in
DeepSeek-V3) holds ``W / s_ij`` rounded to e4m3, and ``W ≈ fp8 * s_ij`` (``scale_inv`` is the
factor that undoes the quantization). Embeddings, the LM head, norms and the router stay in
BF16/FP32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


def stored_fp8(name: str) -> bool:
    """DeepSeek's FP8 rule: whether its FP8 checkpoints store the runtime tensor ``name`` block-scaled
    (the layers' linear projections and the DSA indexer's key and query projections; not the
    indexer's per-head weights, the router, norms, embeddings or the LM head)."""
    if name.endswith("weights_proj.weight") or name.endswith(".mlp.gate.weight"):
        return False
    return name.startswith("model.layers.") and name.endswith(
        ("proj.weight", "proj_with_mqa.weight", "indexer.wq_b.weight", "indexer.wk.weight"))


def scale_name(weight_name: str) -> str:
    """The scale tensor of a quantized weight ``...weight``."""
    return f"{weight_name}_scale_inv"


def scale_rows(rows: slice, block: int) -> slice:
    """Rows of the scale grid that cover weight rows ``rows`` (start and stop set)."""
    return slice(rows.start // block, -(-rows.stop // block))


def dequantize(weight: torch.Tensor, scale: torch.Tensor, rows: slice, cols: slice,
               block: tuple[int, int]) -> torch.Tensor:
    """Float32 values of ``weight``, the part ``[rows, cols]`` of a quantized tensor, given
    ``scale``, the part of its scale grid that covers it (:func:`scale_rows` of both axes)."""
    b0, b1 = block
    expanded = scale.float().repeat_interleave(b0, dim=0).repeat_interleave(b1, dim=1)
    r0, c0 = rows.start - (rows.start // b0) * b0, cols.start - (cols.start // b1) * b1
    return weight.float() * expanded[r0: r0 + weight.shape[0], c0: c0 + weight.shape[1]]


def quantize(weight: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, float32 scale grid) of ``weight`` [out, in]: each block's largest magnitude
    maps to the largest e4m3 value (how DeepSeek-V3's FP8 checkpoints are made; for writers)."""
    rows, cols = weight.shape
    b0, b1 = block
    tiles = F.pad(weight.float(), (0, -cols % b1, 0, -rows % b0)).unflatten(0, (-1, b0)).unflatten(2, (-1, b1))
    scale = tiles.abs().amax(dim=(1, 3)).div(E4M3_MAX).clamp(min=1e-12)
    q = tiles.div(scale[:, None, :, None]).flatten(2, 3).flatten(0, 1)[:rows, :cols]
    return q.to(torch.float8_e4m3fn), scale
