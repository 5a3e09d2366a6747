"""Torch reference of the fused small ops (the spec in :class:`splash_core.platform.interfaces.FusedKernels`).

Each is the unfused sequence the runtime ran before the ops were fused, op for op, so a model
on the reference computes exactly what it did before; device backends replace them with one
kernel each (:mod:`splash_core.kernels.fused`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..platform.interfaces import FusedKernels
from .fp8_cache import cache_layout, quantize
from .kv_format import ScaledFP8
from .rotary import Rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the last dim computed in float32, in ``x``'s dtype. One call to torch's RMSNorm
    (a fused kernel where the device has one), which upcasts 16-bit input and weight itself;
    only a weight of another dtype than ``x`` goes through float32 explicitly."""
    if weight.dtype == x.dtype:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def add_rms_norm(x, residual, weight, eps):
    """(RMSNorm(residual + x) * weight, residual + x); ``residual`` None: (RMSNorm(x) * weight, x)."""
    summed = x if residual is None else residual + x
    return rms_norm(summed, weight, eps), summed


def latent(kv, weight, cos, sin, eps):
    """Cache entries [n, d_c + d_r] from KV-A's output: normalised latent, then the rotated key."""
    d_c = weight.numel()
    return torch.cat([rms_norm(kv[:, :d_c], weight, eps), Rotary(cos, sin)(kv[:, d_c:])], dim=-1)


def write_rows(cache, slots, entries, scaled: ScaledFP8 | None = None) -> None:
    """Store ``entries`` [n, W] at flat ``slots`` of ``cache`` [pages, page_size, W] in its format
    (1-byte formats through a byte view, so the indexed copy works on every device); with
    ``scaled``, ``cache`` is a uint8 scaled-fp8 cache and ``entries`` are quantized into it."""
    width = cache.shape[-1]
    if scaled is not None:
        cache.view(-1, width).index_copy_(0, slots, quantize(entries, scaled))
    elif cache.element_size() == 1 and cache.dtype != torch.uint8:
        cache.view(torch.uint8).view(-1, width).index_copy_(0, slots, entries.to(cache.dtype).view(torch.uint8))
    else:
        cache.view(-1, width).index_copy_(0, slots, entries.to(cache.dtype))


def latent_write(kv, weight, cos, sin, eps, cache, slots) -> None:
    """:func:`latent` written into ``cache`` at ``slots`` (a uint8 cache: quantized to scaled fp8)."""
    d_c = weight.numel()
    write_rows(cache, slots, latent(kv, weight, cos, sin, eps), cache_layout(cache, d_c, kv.shape[1] - d_c))


def silu_mul(gate_up):
    """silu(gate) * up of a row-stacked [gate | up] projection [n, 2 w]."""
    width = gate_up.shape[1] // 2
    return F.silu(gate_up[:, :width]) * gate_up[:, width:]


def rotate(x, cos, sin, out):
    """``x`` [n, ..., d_r] rotated (:class:`Rotary`), written into ``out`` (``x`` itself: in place)."""
    return out.copy_(Rotary(cos, sin)(x))


KERNELS = FusedKernels(add_rms_norm=add_rms_norm, latent=latent, latent_write=latent_write, silu_mul=silu_mul,
                       rotate=rotate)
