"""The backend's fused small ops match the torch reference (:mod:`splash_core.model.ops`)
within the compute dtype's tolerance, at MLA's real dims (d_c 512, d_r 64); and its graph ops,
where it has them, replay what they captured on the inputs of the replay."""

from __future__ import annotations

import pytest
import torch

from splash_core.model import ops as ref
from splash_core.model.rotary import Rotary

from .mla_inputs import tolerance


@pytest.fixture(scope="module")
def fused(conformance_backend, conformance_device, conformance_dtype):
    return conformance_backend.fused_kernels(conformance_device, conformance_dtype)


def _randn(*shape, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def _close(got, want, dtype, what):
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def test_add_rms_norm_matches_reference(fused, conformance_device, conformance_dtype):
    kw = dict(device=conformance_device, dtype=conformance_dtype)
    x, res = _randn(7, 1024, seed=1, **kw), _randn(7, 1024, seed=2, **kw)
    w = 1 + 0.1 * _randn(1024, seed=3, **kw)
    for got, want, what in zip(fused.add_rms_norm(x, res, w, 1e-6), ref.add_rms_norm(x, res, w, 1e-6),
                               ("normed", "summed")):
        _close(got, want, conformance_dtype, what)
    _close(fused.add_rms_norm(x, None, w, 1e-6)[0], ref.add_rms_norm(x, None, w, 1e-6)[0], conformance_dtype, "norm")


def test_latent_write_matches_reference(fused, conformance_device, conformance_dtype):
    kw = dict(device=conformance_device, dtype=conformance_dtype)
    kv, w = _randn(5, 576, seed=4, **kw), 1 + 0.1 * _randn(512, seed=5, **kw)
    rot = Rotary.at(torch.tensor([0, 5, 17, 4096, 70000], device=conformance_device), 64, 10000.0)
    _close(fused.latent(kv, w, rot.cos, rot.sin, 1e-6), ref.latent(kv, w, rot.cos, rot.sin, 1e-6),
           conformance_dtype, "latent")
    slots = torch.tensor([3, 40, 0, 17, 63], device=conformance_device)
    got, want = (torch.zeros(4, 16, 576, **kw) for _ in range(2))
    fused.latent_write(kv, w, rot.cos, rot.sin, 1e-6, got, slots)
    ref.latent_write(kv, w, rot.cos, rot.sin, 1e-6, want, slots)
    _close(got, want, conformance_dtype, "latent_write")
    assert got.view(64, -1).abs().sum(1).nonzero().view(-1).tolist() == sorted(slots.tolist())


def test_latent_write_quantizes_into_a_scaled_fp8_cache(fused, conformance_device, conformance_dtype):
    """Into a uint8 scaled-fp8 cache (656 bytes a token): read back, each latent is at most one
    e4m3 step (1/8 of its row's largest magnitude) from the reference's, the rotary key within
    bf16 rounding, and only the slots are written."""
    from splash_core.model.fp8_cache import dequantize
    from splash_core.model.kv_format import ScaledFP8

    layout = ScaledFP8(512, 64, 4)
    kw = dict(device=conformance_device, dtype=conformance_dtype)
    kv, w = _randn(5, 576, seed=4, **kw), 1 + 0.1 * _randn(512, seed=5, **kw)
    rot = Rotary.at(torch.tensor([0, 5, 17, 4096, 70000], device=conformance_device), 64, 10000.0)
    slots = torch.tensor([3, 40, 0, 17, 63], device=conformance_device)
    got, want = (torch.zeros(4, 16, layout.token_bytes, dtype=torch.uint8, device=conformance_device) for _ in range(2))
    fused.latent_write(kv, w, rot.cos, rot.sin, 1e-6, got, slots)
    ref.latent_write(kv, w, rot.cos, rot.sin, 1e-6, want, slots)
    a, b = (dequantize(c.view(64, -1)[slots], layout) for c in (got, want))
    scale = b[:, :512].abs().amax(dim=1, keepdim=True)
    assert torch.all((a - b)[:, :512].abs() <= scale / 8), "latent_write fp8: latent"
    torch.testing.assert_close(a[:, 512:], b[:, 512:], atol=1e-6, rtol=2 ** -6)
    assert got.view(64, -1).sum(1).nonzero().view(-1).tolist() == sorted(slots.tolist())


def test_rotate_matches_reference(fused, conformance_device, conformance_dtype):
    """The queries' RoPE at MLA's widths (128 heads x 64 rotary channels of 192-wide rows), into
    the rotary channels of a wider tensor and in place (a backend without it uses the reference)."""
    if fused.rotate is None:
        pytest.skip(f"{fused.name}: no fused rotate (the reference serves)")
    kw = dict(device=conformance_device, dtype=conformance_dtype)
    q = _randn(5, 128, 192, seed=7, **kw)
    rot = Rotary.at(torch.tensor([0, 5, 17, 4096, 70000], device=conformance_device), 64, 10000.0)
    want = ref.rotate(q[..., 128:], rot.cos, rot.sin, torch.empty(5, 128, 64, **kw))
    absorbed = torch.zeros(5, 128, 576, **kw)
    _close(fused.rotate(q[..., 128:], rot.cos, rot.sin, absorbed[..., 512:]), want, conformance_dtype, "rotate")
    fused.rotate(q[..., 128:], rot.cos, rot.sin, q[..., 128:])
    _close(q[..., 128:], want, conformance_dtype, "rotate in place")


def test_silu_mul_matches_reference(fused, conformance_device, conformance_dtype):
    gate_up = _randn(6, 2 * 2048, seed=6, device=conformance_device, dtype=conformance_dtype)
    _close(fused.silu_mul(gate_up), ref.silu_mul(gate_up), conformance_dtype, "silu_mul")


def test_graph_ops_replay_on_the_replays_inputs(conformance_backend, conformance_device):
    ops = conformance_backend.graph_ops(conformance_device)
    if ops is None:  # allowed: the model then runs its static-buffer step eagerly
        return
    x = torch.arange(8, dtype=torch.float32, device=conformance_device)
    graph = ops.capture(lambda: (x * 2 + 1,), ops.new_pool(), warmup=1)
    x.copy_(torch.full_like(x, 3.0))
    graph.replay()
    (out,) = graph.outputs
    assert torch.equal(out, torch.full_like(x, 7.0)) and graph.capture_s >= 0 and graph.nbytes >= 0
