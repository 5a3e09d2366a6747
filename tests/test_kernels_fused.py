"""The fused small ops in Triton (residual add + RMSNorm, RoPE with the latent-cache write,
SiLU·mul, the queries' RoPE) against their torch reference, in Triton's interpreter on CPU, fp16 and fp32 (the
interpreter's bf16 is checked on the GPU instead)."""

from __future__ import annotations

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch
import triton
import triton.language as tl

from splash_core.kernels import fused
from splash_core.kernels.fp8_cache import _e4m3_codes
from splash_core.model import ops as ref
from splash_core.model.rotary import Rotary

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


@triton.jit
def _codes_kernel(X, Out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    tl.store(Out + i, _e4m3_codes(tl.load(X + i, mask=ok, other=0.0)).to(tl.uint8), mask=ok)


def _gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("cols", [48, 64])
def test_add_rms_norm_matches_the_reference(dtype, cols):
    g = _gen()
    x, res = (torch.randn(5, cols, generator=g).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(cols, generator=g)).to(dtype)
    wide = torch.randn(5, cols + 8, generator=g).to(dtype)[:, :cols]  # strided rows
    for inp in (x, wide):
        normed, summed = fused.add_rms_norm(inp, res, w, 1e-6)
        want_normed, want_summed = ref.add_rms_norm(inp, res, w, 1e-6)
        torch.testing.assert_close(summed, want_summed, **TOL[dtype])
        torch.testing.assert_close(normed, want_normed, **TOL[dtype])
    plain, same = fused.add_rms_norm(x, None, w, 1e-6)
    assert same is x
    torch.testing.assert_close(plain, ref.add_rms_norm(x, None, w, 1e-6)[0], **TOL[dtype])


def _latent_case(dtype, n=6, d_c=32, d_r=16):
    g = _gen(1)
    kv = torch.randn(n, d_c + d_r, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(d_c, generator=g)).to(dtype)
    rot = Rotary.at(torch.tensor([0, 3, 7, 100, 4095, 12]), d_r, 10000.0)
    return kv, w, rot


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_latent_entries_match_the_reference(dtype):
    kv, w, rot = _latent_case(dtype)
    got = fused.latent(kv, w, rot.cos, rot.sin, 1e-6)
    assert got.dtype == dtype
    torch.testing.assert_close(got, ref.latent(kv, w, rot.cos, rot.sin, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_latent_write_fills_exactly_its_slots(dtype):
    kv, w, rot = _latent_case(dtype)
    slots = torch.tensor([5, 0, 17, 9, 30, 31])
    caches = [torch.zeros(4, 8, kv.shape[1], dtype=dtype) for _ in range(2)]
    fused.latent_write(kv, w, rot.cos, rot.sin, 1e-6, caches[0], slots)
    ref.latent_write(kv, w, rot.cos, rot.sin, 1e-6, caches[1], slots)
    torch.testing.assert_close(caches[0], caches[1], **TOL[dtype])
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[slots] = False
    assert not caches[0].view(32, -1)[untouched].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads", [None, 3, 20])
def test_rotate_writes_the_references_rotation_into_its_target(dtype, heads):
    """Per-head rows (more heads than one program takes) or plain rows, out of place into a view
    of a wider tensor and in place; a planted wrong sign fails the same comparison."""
    g = _gen(2)
    rot = Rotary.at(torch.tensor([0, 3, 7, 100, 4095, 12]), 16, 10000.0)
    shape = (6, 16) if heads is None else (6, heads, 16)
    wide = torch.randn(*shape[:-1], 40, generator=g).to(dtype)
    x = wide[..., 24:]  # a strided view, as a query's rotary channels are
    want = ref.rotate(x, rot.cos, rot.sin, torch.empty(shape, dtype=dtype))
    target = torch.zeros(*shape[:-1], 48, dtype=dtype)
    got = fused.rotate(x, rot.cos, rot.sin, target[..., 32:])
    torch.testing.assert_close(got, want, **TOL[dtype])
    assert torch.equal(target[..., :32], torch.zeros_like(target[..., :32]))  # nothing written beside it
    fused.rotate(x, rot.cos, rot.sin, x)
    torch.testing.assert_close(x, want, **TOL[dtype])
    wrong = ref.rotate(x, rot.cos, -rot.sin, torch.empty(shape, dtype=dtype))
    assert not torch.allclose(got, wrong, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("width", [24, 1500])
def test_silu_mul_matches_the_reference(dtype, width):
    gate_up = torch.randn(3, 2 * width, generator=_gen(2)).to(dtype)
    torch.testing.assert_close(fused.silu_mul(gate_up), ref.silu_mul(gate_up), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("d_c, d_r, groups", [(32, 16, 4), (512, 64, 4), (32, 8, 1)])
def test_latent_write_quantizes_into_a_scaled_fp8_cache(dtype, d_c, d_r, groups):
    """A uint8 cache gets the reference's bytes exactly (power-of-two scales leave only the e4m3
    and bf16 roundings, both to nearest even), rows of very different magnitudes and an all-zero
    row included; read back, each latent is within e4m3's unit roundoff (2**-4) of its row's
    largest magnitude, and nothing outside the slots is written."""
    from splash_core.model.fp8_cache import dequantize
    from splash_core.model.kv_format import ScaledFP8

    layout = ScaledFP8(d_c, d_r, groups)
    kv, w, rot = _latent_case(dtype, d_c=d_c, d_r=d_r)
    kv = (kv.float() * torch.tensor([1, 10, 1e-2, 100, 1e-3, 0])[:, None]).to(dtype)
    slots = torch.tensor([5, 0, 17, 9, 30, 31])
    caches = [torch.zeros(4, 8, layout.token_bytes, dtype=torch.uint8) for _ in range(2)]
    fused.latent_write(kv, w, rot.cos, rot.sin, 1e-6, caches[0], slots)
    ref.latent_write(kv, w, rot.cos, rot.sin, 1e-6, caches[1], slots)
    assert torch.equal(caches[0], caches[1])
    entries = ref.latent(kv, w, rot.cos, rot.sin, 1e-6).float()
    back = dequantize(caches[0].view(32, -1)[slots], layout)
    err = (back - entries)[:, :d_c].abs().amax(dim=1)
    assert torch.all(err <= entries[:, :d_c].abs().amax(dim=1) / 16)
    torch.testing.assert_close(back[:, d_c:], entries[:, d_c:].bfloat16().float(), rtol=0, atol=0)
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[slots] = False
    assert not caches[0].view(32, -1)[untouched].any()


def test_e4m3_rounding_in_integers_equals_torchs_cast():
    """Every e4m3 value, the midpoints between neighbours (ties go to even), points just beside
    them, -0 and a dense grid: the kernel's integer rounding gives torch's codes."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[~values.isnan()].sort().values
    mids = (values[:-1] + values[1:]) / 2
    x = torch.cat([values, mids, torch.nextafter(mids, values[1:]), torch.nextafter(mids, values[:-1]),
                   torch.tensor([-0.0]), torch.linspace(-448, 448, 4001)])
    out = torch.empty(x.numel(), dtype=torch.uint8)
    _codes_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    assert torch.equal(out, x.to(torch.float8_e4m3fn).view(torch.uint8))
