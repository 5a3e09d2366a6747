"""The scaled-fp8 KV cache on a real GPU: the Triton decode and extend kernels in bf16 at
DeepSeek's widths (512 + 64, 4 scales: 656-byte entries, pages of 64) against the torch
reference, the Triton quantizing cache write against the reference's, FlashMLA's fp8 decode
through the hopper backend's adapter (where the wheel is installed), and a model on the
backend's kernels fed the float32 reference's tokens staying within e4m3's roundoff of it.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from splash_core.model import ops as ref_fused
from splash_core.model.fp8_cache import dequantize
from splash_core.model.kv_format import ScaledFP8
from splash_core.reference import mla as ref_mla
from splash_core.testing.mla_inputs import decode_case, extend_case, scaled_fp8_case, tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEEPSEEK = ScaledFP8(512, 64, 4)


def _close(got, want, dtype=torch.bfloat16):
    (out, lse), (ref_out, ref_lse) = got, want
    atol, rtol = tolerance(dtype)
    empty = torch.isneginf(ref_lse)
    assert (~empty).any()  # some row sees a key, else the comparisons below are empty
    assert torch.equal(torch.isneginf(lse), empty) and torch.all(out[empty] == 0)
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=atol, rtol=rtol)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("heads", [16, 64, 128])
def test_triton_decode_and_extend_read_the_scaled_cache_in_bf16(heads):
    from splash_core.kernels import triton_mla_kernels

    device = torch.device("cuda")
    for config_name in ("portable", "hopper"):
        if config_name == "hopper":
            tuned = pytest.importorskip("splash_backend_hopper.tuned")
            config = tuned.load()[0]
        else:
            from splash_core.kernels import PORTABLE as config
        kernels = triton_mla_kernels(config)
        for entry, make in (("decode", decode_case), ("extend", extend_case)):
            case = scaled_fp8_case(make(device, torch.bfloat16, heads=heads, page=64), DEEPSEEK.groups)
            assert case[1].shape[2] == DEEPSEEK.token_bytes == 656
            _close(getattr(kernels, entry)(*case), ref_mla.attention(*case))


def test_triton_cache_write_quantizes_as_the_reference():
    """bf16 KV-A rows through the fused write: the scales and rotary bytes are the reference's;
    an e4m3 code may differ by one step where the GPU's norm rounds a value across a boundary."""
    from splash_core.kernels import triton_fused_kernels
    from splash_core.model.rotary import Rotary

    g = torch.Generator().manual_seed(0)
    n = 300
    kv = (torch.randn(n, 576, generator=g) * torch.logspace(-3, 3, n)[:, None]).bfloat16().cuda()
    w = (1 + 0.1 * torch.randn(512, generator=g)).bfloat16().cuda()
    rot = Rotary.at(torch.arange(n).cuda() * 37, 64, 10000.0)
    slots = torch.randperm(4 * 64 * 2, generator=g)[:n].cuda()
    caches = [torch.zeros(8, 64, 656, dtype=torch.uint8, device="cuda") for _ in range(2)]
    triton_fused_kernels().latent_write(kv, w, rot.cos, rot.sin, 1e-6, caches[0], slots)
    ref_fused.latent_write(kv, w, rot.cos, rot.sin, 1e-6, caches[1], slots)
    got, want = (dequantize(c.view(-1, 656)[slots], DEEPSEEK) for c in caches)
    entries = ref_fused.latent(kv, w, rot.cos, rot.sin, 1e-6).float()
    row_scale = entries[:, :512].abs().amax(dim=1, keepdim=True)
    assert torch.all((got - want)[:, :512].abs() <= row_scale / 8)  # at most one e4m3 step
    assert torch.all((got - entries)[:, :512].abs() <= row_scale / 16 + row_scale / 8)
    torch.testing.assert_close(got[:, 512:], want[:, 512:], atol=1e-6, rtol=2 ** -6)  # bf16, rounded op by op in torch
    same = (caches[0].view(-1, 656)[slots] == caches[1].view(-1, 656)[slots]).float().mean()
    assert same > 0.99


def test_flashmla_fp8_decode_through_the_hopper_adapter():
    flashmla = pytest.importorskip("splash_backend_hopper.flashmla")
    if flashmla.missing_reason():
        pytest.skip(flashmla.missing_reason())
    from flash_mla import has_legacy

    if not has_legacy():
        pytest.skip("this sgl-flash-mla build has no legacy (V3.2 fp8) kernels")

    def no_fallback(*args):
        raise AssertionError("FlashMLA should have served this call")

    decode = flashmla.decode(no_fallback)
    device = torch.device("cuda")
    for heads in flashmla.FP8_HEADS:
        case = scaled_fp8_case(decode_case(device, torch.bfloat16, heads=heads, page=flashmla.PAGE), 4)
        assert flashmla.serves_fp8(case[0], case[1], case[-1])
        _close(decode(*case), ref_mla.attention(*case))


class _DrawnOnCPU:
    """Seeded weights drawn on the CPU, then moved: a device's own generator draws other numbers
    than the CPU reference's."""

    def __init__(self, source):
        self.source = source

    def get(self, name, shape, *, device=None, **kw):
        return self.source.get(name, shape, **kw).to(device)


def _forced_fp8(ctx, forced):
    import dataclasses

    from test_runtime_fp8_kv import PROMPTS, SEED

    from splash_bench.driver import generate
    from splash_core.layouts import Layout
    from splash_core.model.weights import SeededWeights
    from splash_core.profiles.loader import load
    from splash_core.profiles.model import KVCacheFormat
    from splash_core.runtime.model import Model

    profile = dataclasses.replace(load("model", "tiny-mla"), kv_cache=KVCacheFormat("fp8", "bf16", 16))
    model = Model.from_context(ctx, profile, _DrawnOnCPU(SeededWeights(SEED)), Layout.TP, pages_per_layer=24, page_size=16,
                               kv_dtype=torch.float8_e4m3fn, kv_scales=4)
    assert model.pool.format.kv_dtype == torch.uint8 and str(model.pool[0].kv.device).startswith("cuda")
    prompts = [dataclasses.replace(p, owner=0) for p in PROMPTS]
    return generate(model.step, prompts, release=model.release, forced=forced, T=1, page_size=16, chunk=16,
                    new_tokens=12), ctx.backend.name


def test_a_model_on_the_gpu_stays_within_e4m3_roundoff_of_float32():
    import dataclasses

    from test_runtime_fp8_kv import PROMPTS, SEED, TINY, _check_close

    from splash_bench.driver import generate
    from splash_core.model.weights import SeededWeights
    from splash_core.runtime.reference_model import ReferenceModel
    from splash_core.runtime.spawn import RankPool

    ref_model = ReferenceModel(TINY, SeededWeights(SEED))
    prompts = [dataclasses.replace(p, owner=0) for p in PROMPTS]
    ref = generate(ref_model.step, prompts, release=ref_model.release, T=1, page_size=16, chunk=16, new_tokens=12)
    with RankPool(1, backend="auto", timeout_s=600) as pool:
        got, backend = pool.run(_forced_fp8, ref.tokens)[0]
    if backend == "reference":
        pytest.skip("no accelerator backend installed")
    _check_close(got, ref, f"{backend} TP T=1")
