"""Seeded weights kept FP8 (``ffn_weights: fp8`` without a checkpoint folder; issue 39 §2, issue 38).

``get`` returns exactly the dequantized block-scaled codes ``get_block_scaled`` hands out, for a
slice starting inside a block and ending in a partial one, and a rank's TP shard of the MLP starting
inside a block holds, kept FP8, exactly what a dequantize-at-load rank holds (a planted wrong scale
breaks each equality); tensors an FP8 checkpoint keeps in bf16/fp32 are the plain seeded ones and are refused
as FP8; ``weight_source`` picks the FP8 source only where the deployment keeps weights FP8; and a
seeded MoE deployment keeping its feed-forward weights FP8 serves a rollout on two CPU ranks with
its reference check passing exactly, holding about a quarter of the float32 experts' bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from splash_core.checkpoint.fp8 import stored_fp8
from splash_core.checkpoint.seeded_fp8 import SeededFP8Weights
from splash_core.checkpoint.source import weight_source
from splash_core.engine import Job, serve
from splash_core.model.fp8_blocks import BlockScaledFP8
from splash_core.model.weights import SeededWeights
from splash_core.profiles import loader
from splash_core.runtime.feed_forward import load_feed_forward

ROOT = Path(__file__).resolve().parents[1]
NAME, SHAPE = "model.layers.1.mlp.experts.3.down_proj.weight", (100, 90)


def test_get_is_the_dequantized_block_scaled_slice_from_mid_block():
    source = SeededFP8Weights(7, block=(32, 32))
    rows, cols = slice(40, 97), slice(13, 90)  # both start inside a block, end in a partial one
    kept = source.get_block_scaled(NAME, SHAPE, rows=rows, cols=cols)
    assert kept.start == (8, 13) and tuple(kept.scales.shape) == (3, 3) and kept.codes.shape == (57, 77)
    got = source.get(NAME, SHAPE, rows=rows, cols=cols)
    assert torch.equal(got, kept.dequantize())
    assert torch.equal(got, source.get(NAME, SHAPE)[rows, cols])  # the slice of the whole tensor
    plain = SeededWeights(7).get(NAME, SHAPE, rows=rows, cols=cols)
    assert 0 < float((got - plain).abs().max()) < 0.07 * float(plain.abs().max())  # e4m3 rounding, no more
    wrong = kept.scales.clone()
    wrong[1, 2] *= 1.5  # a planted wrong scale: the equality fails
    assert not torch.equal(got, BlockScaledFP8(kept.codes, wrong, kept.start, kept.block).dequantize())


def test_only_what_an_fp8_checkpoint_stores_fp8_is_kept_fp8():
    source = SeededFP8Weights(3)
    for name, shape in (("model.embed_tokens.weight", (64, 32)), ("lm_head.weight", (64, 32)),
                        ("model.layers.1.mlp.gate.weight", (8, 32)), ("model.layers.0.input_layernorm.weight", (32,)),
                        ("model.layers.0.self_attn.indexer.weights_proj.weight", (4, 32))):
        assert not stored_fp8(name)
        assert torch.equal(source.get(name, shape), SeededWeights(3).get(name, shape))
        with pytest.raises(ValueError, match="not stored FP8 block-scaled"):
            source.get_block_scaled(name, shape)
    for name in ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.0.self_attn.o_proj.weight",
                 "model.layers.2.mlp.shared_experts.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"):
        assert stored_fp8(name)
    profile = loader.load("model", "tiny-mla")
    assert type(weight_source(profile, 3)) is SeededWeights
    assert type(weight_source(profile, 3, keep_fp8=True)) is SeededFP8Weights


def _seeded_moe_model() -> dict:
    model = yaml.safe_load((ROOT / "profiles" / "models" / "tiny-mla.yaml").read_text())
    for key in ("indexer", "kind"):
        model.pop(key)
    model.update(name="tiny-mla-moe", moe={"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                          "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4,
                                          "topk_group": 2, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                                          "norm_topk_prob": True, "routed_scaling_factor": 2.5})
    return model


def _seeded_moe_deployment(ffn: str) -> dict:
    return {"kind": "deployment", "name": f"seeded-moe-{ffn}", "backend": "reference", "hardware": "cpu", "T": 2,
            "model": _seeded_moe_model(), "memory_fraction": 0.5, "reserve_gib": 0.0, "page_size": 16,
            "compute_dtype": "fp32", "sparse_attention": False, "ffn_weights": ffn}


def test_a_rank_keeps_its_mid_block_shard_fp8_as_dequantize_at_load_would_hold_it():
    profile = loader.load("model", _seeded_moe_model())
    source = SeededFP8Weights(5)
    # rank 1 of 2 holds MLP rows 96..191 of 192: its shard starts inside the second 128-row block
    kept = load_feed_forward(source, profile, 0, 1, 2, fp8=True)
    plain = load_feed_forward(source, profile, 0, 1, 2)
    assert kept.gate_up.parts[0].start == (96, 0) and torch.equal(kept.gate_up.dequantize(), plain.gate_up)
    assert torch.equal(kept.down.dequantize(), plain.down)
    kept.gate_up.parts[0].scales[0, 0].mul_(2.0)  # a planted wrong scale: the weights the rank computes with differ
    assert not torch.equal(kept.gate_up.dequantize(), plain.gate_up)


class _OneRank:
    def all_reduce(self, t):
        return t


@pytest.mark.parametrize("layer", [0, 1])  # the dense MLP, then the routed and shared experts
def test_gate_and_up_meeting_on_a_block_boundary_become_one_weight_with_the_same_outputs(layer):
    """Gate and up rows that meet on a block boundary are kept as one FP8 weight (one GEMM, one
    activation quantization, no concatenation); rows meeting inside a block stay two. Either way
    the weight and the layer's outputs are those of the model dequantized at load."""
    profile = loader.load("model", _seeded_moe_model())
    x = torch.randn(6, profile.hidden_size, generator=torch.Generator().manual_seed(0))
    parts = {}
    for block in (16, 128):  # 32-row experts and a 192-row MLP fill their 16-row blocks, not 128-row ones
        source = SeededFP8Weights(5, block=(block, block))
        kept = load_feed_forward(source, profile, layer, 0, 1, fp8=True)
        plain = load_feed_forward(source, profile, layer, 0, 1)
        assert torch.equal(kept.gate_up.dequantize(), plain.gate_up)
        assert torch.equal(kept.forward(x, _OneRank()), plain.forward(x, _OneRank()))
        parts[block] = len(kept.gate_up.parts)
        if layer == 1:
            assert len(kept.shared.gate_up.parts) == parts[block]
    assert parts == {16: 1, 128: 2}


def test_a_seeded_deployment_keeping_fp8_serves_and_its_reference_check_passes(rank_pools):
    with pytest.raises(Exception, match="ffn_weights"):
        loader.load("deployment", {**_seeded_moe_deployment("fp8"), "ffn_weights": "fp4"})
    runs = {ffn: rank_pools(2).run(serve, Job(_seeded_moe_deployment(ffn), "rollout-tiny", policy="TP"))[0]
            for ffn in ("compute", "fp8")}
    kept = runs["fp8"]
    assert kept.check["passed"] and kept.check["exact"] and kept.check["tokens"] > 0
    assert kept.output_tokens == runs["compute"].output_tokens > 0
    held = {ffn: run.load["memory"] for ffn, run in runs.items()}
    assert 0 < held["fp8"]["experts"] < 0.3 * held["compute"]["experts"]
