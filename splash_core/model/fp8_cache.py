"""Torch reference of the scaled-fp8 cache format (:class:`~splash_core.model.kv_format.ScaledFP8`):
quantize cache entries into their bytes, and read the bytes back as float32 values.

A group's scale is ``2**e`` for the smallest e with ``448 * 2**e >= amax`` (found from amax's
float32 bits, so no division rounds), at least 2**-126; the latent is multiplied by ``2**-e``
(exact) and rounded to e4m3 (nearest, ties to even); the rotary key is rounded to bf16.
"""

from __future__ import annotations

import torch

from .kv_format import ScaledFP8

_MANTISSA = (1 << 23) - 1
_ABOVE_1_75 = 0x600000  # mantissa bits of 1.75 = 448 / 2**8: above it amax needs one more power of two
_MIN_EXP, _MAX_EXP = -126, 119  # scales and their inverses stay normal float32


def pow2_scales(amax: torch.Tensor) -> torch.Tensor:
    """Float32 power-of-two scales s with ``amax / s <= 448`` (the smallest such), amax >= 0."""
    bits = amax.float().contiguous().view(torch.int32)
    exponent = (bits >> 23) - 127 - 8 + ((bits & _MANTISSA) > _ABOVE_1_75).to(torch.int32)
    return ((exponent.clamp(_MIN_EXP, _MAX_EXP) + 127) << 23).view(torch.float32)


def quantize(entries: torch.Tensor, layout: ScaledFP8) -> torch.Tensor:
    """Cache entries [n, d_c + d_r] (latent, rotary key) as their scaled-fp8 bytes [n, token_bytes]."""
    n, d_c = entries.shape[0], layout.latent_dim
    latent = entries[:, :d_c].float().reshape(n, layout.groups, layout.group_size)
    scales = pow2_scales(latent.abs().amax(dim=-1))  # [n, G]
    codes = (latent / scales[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).reshape(n, d_c)
    rope = entries[:, d_c:].to(torch.bfloat16).contiguous()
    return torch.cat([codes.view(torch.uint8), scales.contiguous().view(torch.uint8), rope.view(torch.uint8)], dim=1)


def dequantize(rows: torch.Tensor, layout: ScaledFP8, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Scaled-fp8 bytes [..., token_bytes] (uint8) as entries [..., d_c + d_r] in ``dtype``: exact in
    float32 and bf16 (e4m3 codes times power-of-two scales, whose exponents both hold), written once;
    another dtype gets the float32 values rounded."""
    if dtype not in (torch.float32, torch.bfloat16):
        return dequantize(rows, layout).to(dtype)
    d_c, groups = layout.latent_dim, (layout.groups, layout.group_size)
    out = torch.empty(*rows.shape[:-1], d_c + layout.rope_dim, dtype=dtype, device=rows.device)
    codes = rows[..., :d_c].view(torch.float8_e4m3fn).to(dtype).unflatten(-1, groups)
    scales = rows[..., d_c: layout.rope_offset].contiguous().view(torch.float32).to(dtype)
    torch.mul(codes, scales[..., None], out=out[..., :d_c].unflatten(-1, groups))
    out[..., d_c:] = rows[..., layout.rope_offset:].contiguous().view(torch.bfloat16)
    return out


def round_trip(entries: torch.Tensor, layout: ScaledFP8) -> torch.Tensor:
    """``entries`` as the cache gives them back after storing them, in their dtype."""
    return dequantize(quantize(entries, layout), layout).to(entries.dtype)


def cache_layout(cache: torch.Tensor, latent_dim: int, rope_dim: int) -> ScaledFP8 | None:
    """The scaled-fp8 layout a cache tensor holds (a uint8 cache), or None (an element format)."""
    if cache.dtype != torch.uint8:
        return None
    return ScaledFP8.of_width(cache.shape[-1], latent_dim, rope_dim)


def pages_in(cache: torch.Tensor, block_table: torch.Tensor, layout: ScaledFP8, dtype: torch.dtype) -> tuple:
    """(pages [R * P, page_size, d_c + d_r] in ``dtype``, table [R, P] int32): a copy of the scaled-fp8
    pages ``block_table`` [R, P] lists (-1: a hole), their values exact in bf16 or wider (e4m3 codes
    times power-of-two scales), and the table that lists them in the copy (holes stay -1)."""
    rows, width = block_table.shape
    pages = dequantize(cache[block_table.clamp(min=0).long()], layout, dtype)  # [R, P, page_size, d_c + d_r]
    listed = torch.arange(rows * width, dtype=torch.int32, device=cache.device).view(rows, width)
    return pages.flatten(0, 1), torch.where(block_table >= 0, listed, -1)
