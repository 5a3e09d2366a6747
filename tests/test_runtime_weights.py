"""Seeded weights (deterministic, T-independent shards), head shards and their inverse, and a
safetensors checkpoint in DeepSeek's naming round-tripped through the distributed model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from splash_bench.driver import Prompt, generate
from splash_core.layouts import Layout
from splash_core.model.mla import MLAMath, MLAWeights
from splash_core.model.weights import SafetensorsWeights, SeededWeights, head_shard, save_checkpoint, tensor_shapes
from splash_core.profiles.loader import load
from splash_core.runtime.kv_pool import LayerKV, PageFormat
from splash_core.runtime.mla_layer import MLALayer
from splash_core.runtime.model import Model
from splash_core.runtime.reference_model import ReferenceModel

PROFILE = load("model", "tiny-mla")


def test_seeded_weights_are_pure_functions_of_seed_and_name():
    a, b = SeededWeights(3), SeededWeights(3)
    name = "model.layers.1.self_attn.o_proj.weight"
    shape = tensor_shapes(PROFILE)[name]
    full = a.get(name, shape)
    assert torch.equal(full, b.get(name, shape))
    assert not torch.equal(full, SeededWeights(4).get(name, shape))
    assert not torch.equal(full, a.get("model.layers.2.self_attn.o_proj.weight", shape))
    assert torch.equal(a.get(name, shape, cols=slice(16, 48)), full[:, 16:48])
    assert full.std().item() == pytest.approx(shape[1] ** -0.5, rel=0.1)


@pytest.mark.parametrize("T", [2, 3, 4])
def test_head_shards_cut_and_join(T):
    source = SeededWeights(0)
    full = MLAWeights.load(source, PROFILE, 1)
    shards = [MLAWeights.load(source, PROFILE, 1, head_shard(12, r, T)) for r in range(T)]
    for r, shard in enumerate(shards):
        cut = full.shard(r, T)
        for name in MLAWeights.SHARDED + ("q_a", "kv_a", "indexer_wk"):
            assert torch.equal(getattr(cut, name), getattr(shard, name)), (r, name)
        assert shard.nbytes()["projections"] * T == full.nbytes()["projections"]
        for name, axis in MLAWeights.SHARD_AXES.items():  # what a switch's all-gather joins along
            grown = [i for i, (a, b) in enumerate(zip(getattr(shard, name).shape, getattr(full, name).shape)) if a != b]
            assert grown == [axis], name
    joined = MLAWeights.from_shards(shards)
    assert joined.is_full and all(torch.equal(getattr(joined, n), getattr(full, n)) for n in MLAWeights.SHARDED)
    with pytest.raises(ValueError, match="needs full weights"):
        shards[0].shard(0, T)
    with pytest.raises(ValueError, match="not 0..11 in order"):
        MLAWeights.from_shards(shards[::-1])


def test_layer_rejects_weights_that_do_not_fit_its_layout():
    full = MLAWeights.load(SeededWeights(0), PROFILE, 0)
    kv = LayerKV(0, 2, PageFormat(16, 40, torch.float32), "cpu")
    layer = MLALayer(0, Layout.DP, full, kv, MLAMath(PROFILE), rank=1, T=2)
    with pytest.raises(ValueError, match=r"TP on rank 1 needs heads range\(6, 12\)"):
        layer.set_layout(Layout.TP)
    layer.set_layout(Layout.DOP, full.shard(1, 2))  # a switch DP -> DOP: cut the shard, keep the pages
    assert layer.layout is Layout.DOP and layer.weights.heads == range(6, 12)
    with pytest.raises(ValueError, match="needs heads range\\(0, 12\\)"):
        layer.set_layout(Layout.CP)


def test_safetensors_round_trip(tmp_path):
    seeded = SeededWeights(5)
    path = save_checkpoint(seeded, PROFILE, tmp_path / "ckpt" / "model.safetensors")
    loaded = SafetensorsWeights(tmp_path / "ckpt")  # a directory of shards works as well as a file
    for name, shape in tensor_shapes(PROFILE).items():
        assert torch.equal(loaded.get(name, shape), seeded.get(name, shape)), name
    name = "model.layers.2.self_attn.kv_b_proj.weight"
    shape = tensor_shapes(PROFILE)[name]
    assert torch.equal(loaded.get(name, shape, rows=slice(32, 64)), seeded.get(name, shape)[32:64])
    o = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(loaded.get(o, tensor_shapes(PROFILE)[o], cols=slice(0, 8), dtype=torch.bfloat16),
                       seeded.get(o, tensor_shapes(PROFILE)[o])[:, :8].bfloat16())
    with pytest.raises(KeyError, match="no tensor 'model.layers.9.mlp.up_proj.weight'"):
        loaded.get("model.layers.9.mlp.up_proj.weight", (192, 96))
    wide = dataclasses.replace(PROFILE, hidden_size=128)
    with pytest.raises(ValueError, match=r"has shape \[256, 96\], the model profile expects \[256, 128\]"):
        loaded.get("model.embed_tokens.weight", tensor_shapes(wide)["model.embed_tokens.weight"])
    with pytest.raises(FileNotFoundError, match="no safetensors checkpoint"):
        SafetensorsWeights(tmp_path / "missing")


def _serve_checkpoint(ctx, path, layout, prompts):
    model = Model.from_context(ctx, PROFILE, SafetensorsWeights(path), layout, pages_per_layer=16, page_size=16)
    return generate(model.step, prompts, T=ctx.world_size, page_size=16, chunk=8, new_tokens=3, release=model.release)


def test_checkpoint_serves_like_the_seeded_reference(rank_pools, tmp_path):
    path = save_checkpoint(SeededWeights(5), PROFILE, tmp_path / "model.safetensors")
    prompts = [Prompt(0, 1, (3, 1, 4, 1, 5, 9, 2, 6, 5, 3)), Prompt(1, 1, (2, 7))]
    ref_model = ReferenceModel(PROFILE, SeededWeights(5))
    ref = generate(ref_model.step, prompts, T=2, page_size=16, chunk=8, new_tokens=3, release=ref_model.release)
    for layout in (Layout.TP, Layout.CP):
        got = rank_pools(2).run(_serve_checkpoint, str(path), layout, prompts)[0]
        assert got.tokens == ref.tokens
        for (ids, a), (ref_ids, b) in zip(got.steps, ref.steps):
            assert ids == ref_ids
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
