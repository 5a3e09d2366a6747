"""The fused small ops of a step in Triton (:class:`splash_core.platform.interfaces.FusedKernels`): one
program per row, the whole row in registers, float32 arithmetic rounded where the torch
reference (:mod:`splash_core.model.ops`) rounds.

- residual add + RMSNorm: one read of each input, one write of each output, where torch runs
  an add and a norm (two launches, the sum written and read back);
- RoPE fused with the latent-cache write: KV-A's output goes straight into its cache slot,
  normalised and rotated, where torch slices, norms, rotates, concatenates, casts and copies;
- SiLU·mul of the row-stacked gate/up projection;
- the queries' RoPE, written in place or into the absorbed queries' rotary channels.

Scaled-fp8 caches (uint8) get the quantizing write of :mod:`.fp8_cache`; unscaled fp8 caches
and rows wider than ``MAX_BLOCK`` go to the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..model import ops as reference
from ..model.kv_format import ScaledFP8
from ..platform.interfaces import FusedKernels
from . import fp8_cache

MAX_BLOCK = 1 << 15  # channels one program holds


@triton.jit
def _add_rms_norm_kernel(X, R, W, Out, Sum, n_cols, eps, s_x, s_r, s_o, s_s,
                         BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * s_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * s_r + cols, mask=ok, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(Sum.dtype.element_ty)  # the sum, rounded as torch's add
        tl.store(Sum + row * s_s + cols, x, mask=ok)
    v = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(v * v, 0) / n_cols + eps)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + row * s_o + cols, (v * rstd * w).to(Out.dtype.element_ty), mask=ok)


@triton.jit
def _latent_kernel(KV, W, Cos, Sin, Out, Slots, eps, s_kv, s_c, s_o,
                   D_C: tl.constexpr, D_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
                   WRITE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if WRITE:
        dest = tl.load(Slots + row).to(tl.int64)
    else:
        dest = row
    c = tl.arange(0, BLOCK_C)
    c_ok = c < D_C
    lat = tl.load(KV + row * s_kv + c, mask=c_ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(lat * lat, 0) / D_C + eps)
    w = tl.load(W + c, mask=c_ok, other=0.0).to(tl.float32)
    normed = (lat * rstd * w).to(KV.dtype.element_ty)  # the reference's norm returns the input's format
    tl.store(Out + dest * s_o + c, normed.to(Out.dtype.element_ty), mask=c_ok)
    r = tl.arange(0, BLOCK_R)
    r_ok = r < D_R
    half = D_R // 2
    k = tl.load(KV + row * s_kv + D_C + r, mask=r_ok, other=0.0).to(tl.float32)
    swapped = tl.load(KV + row * s_kv + D_C + (r + half) % D_R, mask=r_ok, other=0.0).to(tl.float32)
    cos = tl.load(Cos + row * s_c + r, mask=r_ok, other=0.0)
    sin = tl.load(Sin + row * s_c + r, mask=r_ok, other=0.0)
    rotated = (k * cos + swapped * sin).to(KV.dtype.element_ty)
    tl.store(Out + dest * s_o + D_C + r, rotated.to(Out.dtype.element_ty), mask=r_ok)


@triton.jit
def _silu_mul_kernel(GU, Out, width, s_gu, s_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * BLOCK
    cols = start + tl.arange(0, BLOCK)
    ok = cols < width
    g = tl.load(GU + row * s_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * s_gu + width + cols, mask=ok, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(Out.dtype.element_ty).to(tl.float32)  # silu, rounded as torch's
    tl.store(Out + row * s_o + cols, (act * u).to(Out.dtype.element_ty), mask=ok)


@triton.jit
def _rotate_kernel(X, Cos, Sin, Out, heads, s_xn, s_xh, s_on, s_oh, s_c,
                   D_R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    r = tl.arange(0, BLOCK_R)
    r_ok = r < D_R
    ok = (h < heads)[:, None] & r_ok[None, :]
    x_row = X + row * s_xn + h[:, None] * s_xh
    # both halves are read before anything is written: in place is safe
    x = tl.load(x_row + r[None, :], mask=ok, other=0.0).to(tl.float32)
    swapped = tl.load(x_row + ((r + D_R // 2) % D_R)[None, :], mask=ok, other=0.0).to(tl.float32)
    cos = tl.load(Cos + row * s_c + r, mask=r_ok, other=0.0)
    sin = tl.load(Sin + row * s_c + r, mask=r_ok, other=0.0)
    rotated = (x * cos[None, :] + swapped * sin[None, :]).to(X.dtype.element_ty)  # rounded as the reference
    tl.store(Out + row * s_on + h[:, None] * s_oh + r[None, :], rotated.to(Out.dtype.element_ty), mask=ok)


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def add_rms_norm(x, residual, weight, eps):
    """:func:`splash_core.model.ops.add_rms_norm` in one kernel (residual None: a plain
    RMSNorm, returned as (normed, x))."""
    n, cols = x.shape
    if cols > MAX_BLOCK or n == 0:
        return reference.add_rms_norm(x, residual, weight, eps)
    x = _unit(x)
    out = torch.empty_like(x)
    if residual is None:
        summed, res = x, x
    else:
        res = _unit(residual)
        summed = torch.empty_like(x)
    _add_rms_norm_kernel[(n,)](x, res, weight, out, summed, cols, float(eps), x.stride(0), res.stride(0),
                               out.stride(0), summed.stride(0), BLOCK=_block(cols), HAS_RESIDUAL=residual is not None)
    return out, summed


def _latent(kv, weight, cos, sin, eps, out, slots):
    d_c = weight.numel()
    d_r = kv.shape[1] - d_c
    kv = _unit(kv)
    cos, sin = _unit(cos.float()), _unit(sin.float())
    if sin.stride(0) != cos.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    _latent_kernel[(kv.shape[0],)](kv, weight, cos, sin, out, kv if slots is None else slots, float(eps),
                                   kv.stride(0), cos.stride(0), out.stride(0) if slots is None else out.shape[-1],
                                   D_C=d_c, D_R=d_r, BLOCK_C=_block(d_c), BLOCK_R=_block(d_r), WRITE=slots is not None)


def latent(kv, weight, cos, sin, eps):
    """:func:`splash_core.model.ops.latent` in one kernel."""
    if kv.shape[1] > MAX_BLOCK or kv.shape[0] == 0:
        return reference.latent(kv, weight, cos, sin, eps)
    out = torch.empty(kv.shape, dtype=kv.dtype, device=kv.device)
    _latent(kv, weight, cos, sin, eps, out, None)
    return out


def latent_write(kv, weight, cos, sin, eps, cache, slots) -> None:
    """:func:`splash_core.model.ops.latent_write` in one kernel: RoPE fused with the cache write."""
    if cache.dtype == torch.uint8 and kv.shape[1] <= MAX_BLOCK and cache.is_contiguous():
        d_c = weight.numel()
        layout = ScaledFP8.of_width(cache.shape[-1], d_c, kv.shape[1] - d_c)
        return fp8_cache.latent_write_scaled(kv, weight, cos, sin, eps, cache, slots, layout, _block)
    if cache.element_size() == 1 or kv.shape[1] > MAX_BLOCK or not cache.is_contiguous():
        return reference.latent_write(kv, weight, cos, sin, eps, cache, slots)
    if kv.shape[0]:
        _latent(kv, weight, cos, sin, eps, cache, slots)


def silu_mul(gate_up):
    """:func:`splash_core.model.ops.silu_mul` in one kernel."""
    n, both = gate_up.shape
    width = both // 2
    out = torch.empty(n, width, dtype=gate_up.dtype, device=gate_up.device)
    if n and width:
        gate_up = _unit(gate_up)
        block = min(1024, _block(width))
        _silu_mul_kernel[(n, triton.cdiv(width, block))](gate_up, out, width, gate_up.stride(0), out.stride(0),
                                                         BLOCK=block)
    return out


def rotate(x, cos, sin, out):
    """:func:`splash_core.model.ops.rotate` in one kernel (rows [n, d_r] or [n, h, d_r] with a
    unit channel stride; anything else goes to the reference)."""
    if x.dim() not in (2, 3) or x.shape != out.shape or x.stride(-1) != 1 or out.stride(-1) != 1 or x.shape[-1] % 2:
        return reference.rotate(x, cos, sin, out)
    n, d_r = x.shape[0], x.shape[-1]
    x3, out3 = (t if t.dim() == 3 else t.unsqueeze(1) for t in (x, out))
    heads = x3.shape[1]
    if n and heads:
        cos, sin = _unit(cos.float()), _unit(sin.float())
        if sin.stride(0) != cos.stride(0):
            cos, sin = cos.contiguous(), sin.contiguous()
        block_h = 16
        _rotate_kernel[(n, triton.cdiv(heads, block_h))](
            x3, cos, sin, out3, heads, x3.stride(0), x3.stride(1), out3.stride(0), out3.stride(1), cos.stride(0),
            D_R=d_r, BLOCK_R=_block(d_r), BLOCK_H=block_h)
    return out


KERNELS = FusedKernels(add_rms_norm=add_rms_norm, latent=latent, latent_write=latent_write, silu_mul=silu_mul,
                       rotate=rotate, name="triton")
