"""Kimi-Linear (``KimiLinearForCausalLM``) against transformers itself, on a tiny checkpoint that
transformers writes: KDA and MLA layers interleaved (kda, mla, kda, mla) with different head counts
(8 KDA heads of 16, 4 MLA heads), MLA without position encoding and with Q-LoRA, a dense first
layer then sigmoid, bias-corrected, group-limited MoE with a shared expert, stored under Kimi's
names (``block_sparse_moe``, experts' ``w1``/``w2``/``w3``).

transformers' kimi_linear runs on CPU without flash-linear-attention: its KDA chunked and
recurrent kernels and its causal convolutions fall back to its own PyTorch code, so transformers'
model, end to end, is the oracle.

The proof is test_checkpoint_transformers' (same prompts, chunked prefill, teacher forcing with
transformers' 32 greedy tokens): in every layout at T = 1 and 2 each step's logits equal
transformers' within 1e-4 of the largest |logit| (float32) and the greedy tokens are
transformers'; the engine generates them while switching live through all 12 directions (T = 2);
``splash generate --model DIR`` prints them (and serves a text prompt through the tokenizer
written beside the weights). The same check fails when the MLA layers are made to
rotate (a planted fault), and config spellings SPLASH cannot honour are refused by name."""

from __future__ import annotations

import json
import shutil

import hf_checkpoints as hf
import pytest
import test_checkpoint_transformers as base
import torch
from transformers import AutoModelForCausalLM, KimiLinearConfig

from splash_core.checkpoint.source import CheckpointWeights
from splash_core.checkpoint.tiny import write_tokenizer
from splash_core.cli.main import main
from splash_core.layouts import Layout
from splash_core.profiles.checkpoint_config import CheckpointError, profile_from_checkpoint

TOLERANCE = 1e-4
# vocab: the builtin tiny tokenizer's, written beside the weights for `splash generate --model`
CONFIG = dict(vocab_size=384, hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
              qk_rope_head_dim=8, v_head_dim=16, num_local_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
              mlp_layer_types=["dense", "sparse", "sparse", "sparse"], linear_head_dim=16, linear_num_heads=8,
              linear_conv_kernel_dim=4, bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """(folder, transformers' (tokens, float32 logits) per prompt)."""
    folder = tmp_path_factory.mktemp("kimi-linear") / "hf"
    model = AutoModelForCausalLM.from_config(KimiLinearConfig(**CONFIG), dtype=torch.float32)
    hf._redraw(model, 37)
    model.save_pretrained(folder)
    write_tokenizer(folder, CONFIG["vocab_size"])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return str(folder), [hf.greedy(model, p, base.NEW) for p in base.PROMPTS]


def test_the_profile_is_derived_from_config_json(kimi):
    profile = profile_from_checkpoint(kimi[0])
    assert [str(k) for k in profile.layers.kinds] == ["kda", "mla", "kda", "mla"] and not profile.mla_rope
    assert (profile.kda.heads, profile.kda.head_dim, profile.kda.conv_size, profile.mla.heads) == (8, 16, 4, 4)
    e = profile.moe
    assert (e.n_routed_experts, e.first_k_dense_replace, e.n_group, e.topk_group, e.routed_scaling_factor,
            e.n_shared_experts) == (8, 1, 4, 2, 2.446, 1)


@pytest.mark.parametrize("T", [1, 2])
def test_every_layout_gives_transformers_logits_and_tokens(rank_pools, kimi, T):
    folder, ref = kimi
    got = rank_pools(T).run(base._layouts, {"kimi": (folder, "fp32", [tokens for tokens, _ in ref])})[0]
    for layout in Layout:
        base.assert_equals_transformers(got["kimi", str(layout)], ref, TOLERANCE, layout)


def _rotating(ctx, folder, forced):
    """The planted fault: the same checkpoint with its MLA layers rotating, TP on one rank."""
    from splash_bench.driver import Prompt, generate
    from splash_core.runtime.model import Model

    profile = profile_from_checkpoint(folder, {"mla_rope": True})
    model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), Layout.TP, pages_per_layer=16,
                               page_size=base.PAGE, dtype=torch.float32)
    prompts = [Prompt(i, 0, tuple(p)) for i, p in enumerate(base.PROMPTS)]
    return generate(model.step, prompts, T=1, page_size=base.PAGE, chunk=base.CHUNK, new_tokens=base.NEW,
                    release=model.release, forced=dict(enumerate(forced)))


def test_the_check_fails_when_mla_rotates(rank_pools, kimi):
    folder, ref = kimi
    gen = rank_pools(1).run(_rotating, folder, [tokens for tokens, _ in ref])[0]
    assert base.relative_errors(gen, ref).max() > 100 * TOLERANCE


def test_live_switches_in_every_direction_keep_transformers_tokens(rank_pools, kimi):
    folder, ref = kimi
    base.assert_switches_keep_tokens(rank_pools(2), folder, ref, 2)


def test_each_rank_reads_only_its_slices(kimi):
    from splash_core.model.kda import KDAWeights
    from splash_core.model.weights import head_shard
    from splash_core.runtime.feed_forward import MoE

    profile = profile_from_checkpoint(kimi[0])

    def read(rank, T):  # KDA layer 0's heads, MoE layer 2's experts
        source = CheckpointWeights(kimi[0], profile)
        moe = MoE.load(source, profile, 2, rank, T)
        kda = KDAWeights.load(source, profile, 0, head_shard(profile.kda.heads, rank, T))
        return source.bytes_read, moe, kda

    whole, moe, kda = read(0, 1)
    parts = [read(r, 2) for r in range(2)]
    assert [m.experts for _, m, _ in parts] == [range(0, 4), range(4, 8)]
    assert [k.heads for _, _, k in parts] == [range(0, 4), range(4, 8)]
    # read whole on every rank: the router and its bias, the conv taps, the gates' down-projections, the output
    # norm, and A_log (one float per head, cut after reading)
    replicated = sum(t.numel() * 4 for t in (moe.router, moe.bias, kda.conv, kda.f_a, kda.g_a, kda.o_norm, kda.a_log))
    assert sum(n for n, _, _ in parts) - whole == replicated and all(n < whole for n, _, _ in parts)


def test_splash_generate_serves_the_folder(kimi, capsys):
    folder, ref = kimi
    base.assert_generate_gives_transformers_tokens(folder, ref, capsys)
    # text in, text out, through the tokenizer beside the weights
    assert main(["generate", "--model", folder, "--prompt", "the model", "--max-new-tokens", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["check"]["passed"]


@pytest.mark.parametrize("change, message", [
    ({"mlp_layer_types": ["dense", "sparse", "dense", "sparse"]}, "mlp_layer_types[2]: SPLASH runs dense MLP layers"),
    ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
     "layer_types[1]: expected one of full_attention, linear_attention"),
    ({"layer_types": None,
      "linear_attn_config": {"kda_layers": [1, 3], "full_attn_layers": [2, 4], "gate_lower_bound": 1}},
     "linear_attn_config.gate_lower_bound: not supported"),
    ({"mla_use_nope": False}, "mla_use_nope: Kimi-Linear (as transformers) runs mla_use_nope = True"),
    ({"moe_router_activation_func": "softmax"}, "moe_router_activation_func: Kimi-Linear (as transformers) runs"),
    ({"swa_window": 128}, "swa_window: config key not supported"),
])
def test_config_spellings_it_cannot_honour_are_refused(kimi, tmp_path, change, message):
    folder = tmp_path / "kimi"
    shutil.copytree(kimi[0], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(CheckpointError) as refused:
        profile_from_checkpoint(folder)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_original_config_spelling_gives_the_same_profile(kimi, tmp_path):
    folder = tmp_path / "kimi"
    shutil.copytree(kimi[0], folder)
    cfg = json.loads((folder / "config.json").read_text())
    for key in ("layer_types", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim"):
        del cfg[key]
    cfg["linear_attn_config"] = {"kda_layers": [1, 3], "full_attn_layers": [2, 4], "head_dim": 16, "num_heads": 8,
                                 "short_conv_kernel_size": 4}
    cfg.update(mla_use_nope=True, moe_router_activation_func="sigmoid", use_grouped_topk=True, moe_layer_freq=1,
               num_nextn_predict_layers=0)  # keys of moonshotai's config.json that transformers ignores
    (folder / "config.json").write_text(json.dumps(cfg))
    same = ("layers", "kda", "mla", "moe", "mla_rope")
    mine, theirs = profile_from_checkpoint(folder), profile_from_checkpoint(kimi[0])
    assert all(getattr(mine, f) == getattr(theirs, f) for f in same)
