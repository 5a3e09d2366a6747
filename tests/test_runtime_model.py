"""The model's construction paths and options: from a deployment profile, FP8 KV pages, and the
clear errors for what the runtime does not run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.source import weight_source
from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.runtime.model import Model
from splash_core.runtime.reference_model import ReferenceModel

PROMPTS = [Prompt(0, 1, tuple(range(3, 40))), Prompt(1, 1, (5, 6, 7))]
RUN = dict(T=2, page_size=16, chunk=16, new_tokens=8)


def _from_deployment(ctx):
    deployment = load("deployment", "cpu-tiny")
    model = Model.from_deployment(ctx, deployment, pages_per_layer=8)
    gen = generate(model.step, PROMPTS, release=model.release, **RUN)
    return str(model.layers[0].layout), model.layers[0].kv.kv.dtype, model.dtype, gen


def test_model_from_deployment_profile(rank_pools):
    deployment = load("deployment", "cpu-tiny")
    ref_model = ReferenceModel(deployment.model, weight_source(deployment.model, deployment.seed))
    ref = generate(ref_model.step, PROMPTS, release=ref_model.release, **RUN)
    layout, kv_dtype, dtype, gen = rank_pools(2).run(_from_deployment)[1]
    assert (layout, kv_dtype, dtype) == (str(deployment.initial_layout), torch.float32, torch.float32)
    assert gen.tokens == ref.tokens


def _fp8_pages(ctx, layout, forced):
    model = Model.from_context(ctx, load("model", "tiny-mla"), SeededWeights(0), layout, pages_per_layer=16,
                               page_size=16, kv_dtype=torch.float8_e4m3fn)
    return generate(model.step, PROMPTS, release=model.release, forced=forced, **RUN)


def test_fp8_kv_pages_stay_close_to_the_reference(rank_pools):
    """FP8 e4m3 keeps 3 mantissa bits (relative rounding up to 1/16): teacher-forced logits stay
    within a tenth of their scale, and every layout rounds the same stored values."""
    ref_model = ReferenceModel(load("model", "tiny-mla"), SeededWeights(0))
    ref = generate(ref_model.step, PROMPTS, release=ref_model.release, **RUN)
    scale = max(np.abs(logits).max() for _, logits in ref.steps)
    errors = {}
    for layout in (Layout.TP, Layout.CP):
        got = rank_pools(2).run(_fp8_pages, layout, ref.tokens)[0]
        errors[layout] = max(np.abs(a - b).max() for (_, a), (_, b) in zip(got.steps, ref.steps))
        assert 0 < errors[layout] < 0.1 * scale, layout  # not zero: the pages really are FP8
    assert errors[Layout.TP] == pytest.approx(errors[Layout.CP], rel=1e-3)


def _build(ctx, profile, layouts):
    try:
        Model.from_context(ctx, profile, SeededWeights(0), layouts, pages_per_layer=2, page_size=16)
    except ValueError as exc:
        return str(exc)
    return None


def test_unsupported_models_fail_clearly(rank_pools):
    pool = rank_pools(2)
    hybrid = load("model", "tiny-hybrid")
    odd_kda = dataclasses.replace(hybrid, kda=dataclasses.replace(hybrid.kda, heads=3))
    assert "3 heads do not split over T = 2" in pool.run(_build, odd_kda, Layout.TP)[0]
    assert "2 layouts given for 3 layers" in pool.run(_build, load("model", "tiny-mla"), [Layout.TP, Layout.CP])[0]
    odd = dataclasses.replace(load("model", "tiny-mla"), mla=dataclasses.replace(load("model", "tiny-mla").mla, heads=3))
    assert "3 heads do not split over T = 2" in pool.run(_build, odd, Layout.DOP)[0]
