"""GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``) against transformers itself, on a tiny checkpoint
that transformers writes: MLA with interleaved rotary and Q-LoRA, a dense first layer then
sigmoid, bias-corrected, group-limited MoE with a shared expert, its MoE layers named by
``mlp_layer_types``; its latent projections are scaled down so that the latent norms' epsilon
(transformers' and DeepSeek's 1e-6, not the config's ``rms_norm_eps`` of 1e-5) shows in the logits.

The proof is test_checkpoint_transformers' (same prompts, chunked prefill, teacher forcing with
transformers' 32 greedy tokens): in every layout at T = 1, 2, 4 each step's logits equal
transformers' within 1e-4 of the largest |logit| (float32) and the greedy tokens are
transformers'; the engine generates them while switching live through all 12 directions (T = 4);
``splash generate --model DIR`` prints them. Also: config spellings SPLASH cannot honour
(a dense layer after an MoE one, a disagreeing ``first_k_dense_replace``) are refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hf_checkpoints as hf
import pytest
import test_checkpoint_transformers as base
import torch

from splash_core.checkpoint import tiny
from splash_core.layouts import Layout
from splash_core.profiles.checkpoint_config import CheckpointError, profile_from_checkpoint

TOLERANCE = 1e-4
LATENT_SCALE = 2e-3


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    """(folder, transformers' (tokens, float32 logits) per prompt); the folder holds the builtin
    tiny checkpoint's tokenizer (same vocabulary), as a published folder holds its own."""
    root = tmp_path_factory.mktemp("glm4-moe-lite")
    folder = root / "hf"
    model = hf.write("glm4-moe-lite", folder, seed=47)
    with torch.no_grad():  # latents of RMS ~2e-3, where the latent norms' epsilon (1e-6, not 1e-5) matters
        for layer in model.model.layers:
            layer.self_attn.q_a_proj.weight.mul_(LATENT_SCALE)
            layer.self_attn.kv_a_proj_with_mqa.weight[: model.config.kv_lora_rank].mul_(LATENT_SCALE)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny.ensure("tiny-deepseek-v3", root / "tiny")) / name, folder / name)
    return str(folder), [hf.greedy(model, p, base.NEW) for p in base.PROMPTS]


def test_the_profile_is_derived_from_config_json(glm):
    profile = profile_from_checkpoint(glm[0])
    assert profile.rope_interleave and profile.mla.q_lora_rank == 48 and profile.rms_norm_eps == 1e-5
    e = profile.moe
    assert (e.first_k_dense_replace, e.topk_method, e.scoring_func, e.routed_scaling_factor) == (1, "noaux_tc",
                                                                                                 "sigmoid", 1.8)


@pytest.mark.parametrize("T", [1, 2, 4])
def test_every_layout_gives_transformers_logits_and_tokens(rank_pools, glm, T):
    folder, ref = glm
    got = rank_pools(T).run(base._layouts, {"glm": (folder, "fp32", [tokens for tokens, _ in ref])})[0]
    for layout in Layout:
        base.assert_equals_transformers(got["glm", str(layout)], ref, TOLERANCE, layout)


def test_live_switches_in_every_direction_keep_transformers_tokens(rank_pools, glm):
    folder, ref = glm
    base.assert_switches_keep_tokens(rank_pools(4), folder, ref, 4)


def test_each_rank_reads_only_its_slices(glm):
    from splash_core.checkpoint.source import CheckpointWeights
    from splash_core.model.mla import MLAWeights
    from splash_core.model.weights import head_shard
    from splash_core.runtime.feed_forward import MoE

    profile = profile_from_checkpoint(glm[0])

    def read(rank, T):
        source = CheckpointWeights(glm[0], profile)
        moe = MoE.load(source, profile, 1, rank, T)
        attention = MLAWeights.load(source, profile, 1, head_shard(profile.mla.heads, rank, T))
        return source.bytes_read, moe, attention

    whole, moe, attention = read(0, 1)
    parts = [read(r, 2) for r in range(2)]
    assert [m.experts for _, m, _ in parts] == [range(0, 4), range(4, 8)]
    replicated = sum(t.numel() * 4 for t in (moe.router, moe.bias, attention.q_a, attention.q_a_norm, attention.kv_a,
                                             attention.kv_a_norm))
    assert sum(n for n, _, _ in parts) - whole == replicated and all(n < whole for n, _, _ in parts)


def test_splash_generate_serves_the_folder(glm, capsys):
    folder, ref = glm
    base.assert_generate_gives_transformers_tokens(folder, ref, capsys)


def test_the_published_spelling_loads_alike(glm, tmp_path):
    """GLM-4.7-Flash's own config.json says first_k_dense_replace and topk_method (no mlp_layer_types)
    and declares an MTP layer: the same profile, the MTP layer ignored and said so."""
    folder = tmp_path / "glm"
    shutil.copytree(glm[0], folder)
    cfg = {k: v for k, v in json.loads((folder / "config.json").read_text()).items() if k != "mlp_layer_types"}
    (folder / "config.json").write_text(json.dumps({**cfg, "first_k_dense_replace": 1, "topk_method": "noaux_tc",
                                                    "num_nextn_predict_layers": 1}))
    mine, theirs = profile_from_checkpoint(folder), profile_from_checkpoint(glm[0])
    assert mine.moe == theirs.moe and mine.mla == theirs.mla and "MTP layers 2..2" in mine.notes


@pytest.mark.parametrize("change, message", [
    ({"mlp_layer_types": ["sparse", "dense"]}, "mlp_layer_types[1]: SPLASH runs dense MLP layers only before"),
    ({"first_k_dense_replace": 2}, "first_k_dense_replace: GLM-4.7-Flash (as transformers) runs"),
    ({"topk_method": "greedy"}, "topk_method: GLM-4.7-Flash (as transformers) runs"),
])
def test_config_spellings_it_cannot_honour_are_refused(glm, tmp_path, change, message):
    folder = tmp_path / "glm"
    shutil.copytree(glm[0], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(CheckpointError) as refused:
        profile_from_checkpoint(folder)
    assert message in str(refused.value) and "\n" not in str(refused.value)
