"""RoPE fused with the scaled-fp8 cache write, in Triton (the uint8 caches of
:func:`splash_core.kernels.fused.latent_write`): one program per row normalises the latent,
finds each group's power-of-two scale, stores the e4m3 codes, the float32 scales and the
rotated rotary key in bf16 straight into the row's cache slot; the same bytes as
:func:`splash_core.model.fp8_cache.quantize`.

The e4m3 codes and the bf16 rotary key are rounded in integer arithmetic on the float32 bits
(nearest, ties to even), not by casts: Triton's interpreter rounds a float8 cast wrongly where
the mantissa carries into the exponent (31.3 became 16) and a bf16 cast by truncation, and the
integer rounding is the same on every target.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..model.kv_format import ScaledFP8


@triton.jit
def _e4m3_codes(y):
    """e4m3fn codes (int32, sign in bit 7) of float32 ``y`` with |y| <= 448."""
    magnitude = tl.abs(y)
    bits = magnitude.to(tl.int32, bitcast=True)
    # Normal codes: drop 20 of the 23 mantissa bits, rounding to nearest even; a carry moves
    # into the exponent by itself. Rebias the exponent from 127 to 7.
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - ((127 - 7) << 3)
    # Below 2**-6 the codes are subnormal steps of 2**-9: round |y| * 2**9 (exact) to an integer,
    # ties to even, by adding and removing 2**23.
    steps = (magnitude * 512.0 + 8388608.0) - 8388608.0
    code = tl.where(magnitude < 0.015625, steps.to(tl.int32), tl.minimum(normal, 0x7E))
    return tl.where(y.to(tl.int32, bitcast=True) < 0, code | 0x80, code)  # the sign bit: -0 too


@triton.jit
def _bf16_bits(x):
    """bf16 bits (int32, low 16 bits) of finite float32 ``x``, rounded to nearest even."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


@triton.jit
def _pow2_scale_bits(amax):
    """Float32 bits of the smallest power of two s with amax / s <= 448 (amax >= 0), in [2**-126, 2**119]."""
    bits = amax.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    return (tl.minimum(tl.maximum(exponent, -126), 119) + 127) << 23


@triton.jit
def _latent_scaled_kernel(KV, W, Cos, Sin, Cache, Slots, eps, s_kv, s_c, s_t,
                          D_C: tl.constexpr, D_R: tl.constexpr, GROUPS: tl.constexpr,
                          BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    token = Cache + tl.load(Slots + row).to(tl.int64) * s_t  # this row's bytes
    c = tl.arange(0, BLOCK_C)
    c_ok = c < D_C
    lat = tl.load(KV + row * s_kv + c, mask=c_ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(lat * lat, 0) / D_C + eps)
    w = tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)
    normed = (lat * rstd * w).to(KV.dtype.element_ty).to(tl.float32)  # the reference's norm returns the input's format
    group = c // (D_C // GROUPS)
    inverse = tl.zeros([BLOCK_C], tl.float32)
    scales = (token + D_C).to(tl.pointer_type(tl.int32))
    for g in tl.static_range(GROUPS):
        mine = c_ok & (group == g)
        scale_bits = _pow2_scale_bits(tl.max(tl.where(mine, tl.abs(normed), 0.0), 0))
        tl.store(scales + g, scale_bits)
        inverse = tl.where(mine, ((254 << 23) - scale_bits).to(tl.float32, bitcast=True), inverse)  # 1 / s, exact
    scaled = tl.minimum(tl.maximum(normed * inverse, -448.0), 448.0)
    tl.store(token + c, _e4m3_codes(scaled).to(tl.uint8), mask=c_ok)
    r = tl.arange(0, BLOCK_R)
    r_ok = r < D_R
    half = D_R // 2
    k = tl.load(KV + row * s_kv + D_C + r, mask=r_ok, other=0.0).to(tl.float32)
    swapped = tl.load(KV + row * s_kv + D_C + (r + half) % D_R, mask=r_ok, other=0.0).to(tl.float32)
    cos = tl.load(Cos + row * s_c + r, mask=r_ok, other=0.0)
    sin = tl.load(Sin + row * s_c + r, mask=r_ok, other=0.0)
    rotated = (k * cos + swapped * sin).to(KV.dtype.element_ty).to(tl.float32)
    rope = (token + D_C + 4 * GROUPS).to(tl.pointer_type(tl.int16))
    tl.store(rope + r, _bf16_bits(rotated).to(tl.int16), mask=r_ok)


def latent_write_scaled(kv, weight, cos, sin, eps, cache, slots, layout: ScaledFP8, block) -> None:
    """Cache entries of KV-A's output ``kv`` quantized into the uint8 scaled-fp8 ``cache`` at ``slots``."""
    if kv.shape[0] == 0:
        return
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    _latent_scaled_kernel[(kv.shape[0],)](
        kv, weight, cos, sin, cache, slots, float(eps), kv.stride(0), cos.stride(0), layout.token_bytes,
        D_C=layout.latent_dim, D_R=layout.rope_dim, GROUPS=layout.groups,
        BLOCK_C=block(layout.latent_dim), BLOCK_R=block(layout.rope_dim))

