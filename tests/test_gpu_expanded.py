"""Prefill in the expanded form on a real GPU: the backend's expanded kernel in bf16 at
DeepSeek's per-head widths (128 + 64 keys, 128 values) against the torch reference, and a model
on the backend's kernels, prefilling absorbed, expanded and by the per-request choice, giving the
float32 reference's tokens and logits. Skipped without CUDA."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_gpu_fp8_kv import _DrawnOnCPU

from splash_core.reference.expanded import expanded_attention
from splash_core.testing.mla_inputs import expanded_case, tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("heads", [16, 128])
def test_triton_expanded_kernel_in_bf16(heads):
    from splash_core.kernels import triton_expanded_attention

    case = expanded_case(torch.device("cuda"), torch.bfloat16, heads=heads)
    (out, lse), (ref_out, ref_lse) = triton_expanded_attention()(*case), expanded_attention(*case)
    atol, rtol = tolerance(torch.bfloat16)
    empty = torch.isneginf(ref_lse)
    assert (~empty).any()  # some row sees a key, else the comparisons below are empty
    assert torch.equal(torch.isneginf(lse), empty) and torch.all(out[empty] == 0)
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=atol, rtol=rtol)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=atol, rtol=rtol)


def _serve(ctx, form, layout):
    from test_runtime_expanded import PROMPTS, RUN

    from splash_bench.driver import generate
    from splash_core.model.weights import SeededWeights
    from splash_core.profiles.loader import load
    from splash_core.runtime.model import Model

    model = Model.from_context(ctx, load("model", "tiny-mla"), _DrawnOnCPU(SeededWeights(3)), layout,
                               pages_per_layer=40, page_size=RUN["page_size"], attention_form=form)
    prompts = [dataclasses.replace(p, owner=0) for p in PROMPTS]
    return (generate(model.step, prompts, release=model.release, T=1, **RUN), ctx.backend.name,
            model.kernels.expanded is not None)


def test_a_model_prefilling_in_each_form_gives_the_reference_tokens():
    from test_runtime_expanded import PROMPTS, RUN

    from splash_bench.driver import generate
    from splash_core.layouts import Layout
    from splash_core.model.weights import SeededWeights
    from splash_core.profiles.loader import load
    from splash_core.runtime.reference_model import ReferenceModel
    from splash_core.runtime.spawn import RankPool

    ref_model = ReferenceModel(load("model", "tiny-mla"), SeededWeights(3))
    ref = generate(ref_model.step, [dataclasses.replace(p, owner=0) for p in PROMPTS], T=1, release=ref_model.release,
                   **RUN)
    with RankPool(1, backend="auto", timeout_s=600) as pool:
        for layout in (Layout.TP, Layout.CP, Layout.DP):
            for form in ("absorbed", "expanded", "auto"):
                got, backend, has_kernel = pool.run(_serve, form, layout)[0]
                if backend == "reference":
                    pytest.skip("no accelerator backend installed")
                assert has_kernel, f"{backend} has no expanded kernel"
                assert got.tokens == ref.tokens, (layout, form)
                for (_, a), (_, b) in zip(got.steps, ref.steps):
                    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3, err_msg=f"{layout} {form}")
