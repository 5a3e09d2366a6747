"""Tiny DeepseekV2/V3, GLM-4.7-Flash (Glm4MoeLite) and GLM-5 (GlmMoeDsa) checkpoints written by
transformers itself (``save_pretrained``), for the proof that SPLASH computes what transformers computes.

Weights are re-drawn at unit scale (linear N(0, 1/fan_in), norms 1 + N(0, 0.1²), embeddings
N(0, 1), router bias N(0, 0.1²)) instead of transformers' N(0, 0.02²), so activations and logits
keep unit scale and greedy choices are decided by clear margins. :func:`quantize_fp8` is the
block quantizer of DeepSeek-V3's published FP8 format (e4m3, one float32 scale per 128 x 128
block, stored as ``weight_scale_inv``), applied to the weights a real checkpoint quantizes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config, Glm4MoeLiteConfig,  # noqa: E402
                          GlmMoeDsaConfig)

FP8_MAX = 448.0  # largest finite float8_e4m3fn
BLOCK = (128, 128)

# dims shared by the variants: heads divisible by T = 1, 2, 4; groups of 2 experts
BASE = dict(vocab_size=160, hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1,
            max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0,
            eos_token_id=1)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}
VARIANTS = {
    # DeepSeek-V3 layout: interleaved rotary, YaRN, sigmoid + noaux_tc grouped top-k, a shared expert
    "v3-yarn-interleaved": dict(arch="v3", rope_interleave=True, rope_parameters=YARN, n_group=4, topk_group=2,
                                n_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=2.5),
    # rotate-half rotary, plain RoPE, two shared experts, no renormalisation
    "v3-rotate-half": dict(arch="v3", rope_interleave=False, rope_parameters={"rope_type": "default",
                                                                             "rope_theta": 5000.0},
                           n_group=2, topk_group=1, n_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.5),
    # DeepSeek-V2-Lite layout: q_lora_rank null (a plain q_proj), softmax routing by groups, YaRN
    "v2-lite": dict(arch="v2", q_lora_rank=None, rope_parameters=YARN, topk_method="group_limited_greedy", n_group=4,
                    topk_group=2, n_shared_experts=2, routed_scaling_factor=1.0),
    # GLM-4.7-Flash layout: MoE layers named by mlp_layer_types (BASE's first_k_dense_replace = 1 agrees with it;
    # transformers ignores that key, SPLASH checks it)
    # (vocab: the builtin tiny tokenizer's, so `splash generate --model` has a tokenizer to copy in)
    "glm4-moe-lite": dict(arch="glm4_moe_lite", mlp_layer_types=["dense", "sparse"], vocab_size=384,
                          rope_parameters={"rope_type": "default", "rope_theta": 20000.0}, n_group=4, topk_group=2,
                          n_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=1.8, rms_norm_eps=1e-5),
}
# GLM-5 layout: shared-indexer layers (full, shared, full, shared), interleaved indexer RoPE, v_head_dim != qk_nope,
# index_topk 6 so that selection drops keys within a few tokens (write it with write_dsa: positive head weights)
VARIANTS["glm5-shared"] = dict(
    arch="glm_moe_dsa", num_hidden_layers=4, indexer_types=["full", "shared", "full", "shared"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"], vocab_size=384, v_head_dim=24, rope_parameters=YARN,
    n_group=4, topk_group=2, n_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=2.5, rms_norm_eps=1e-5,
    index_n_heads=8, index_head_dim=16, index_topk=6)
CONFIGS = {"v2": DeepseekV2Config, "v3": DeepseekV3Config, "glm4_moe_lite": Glm4MoeLiteConfig,
           "glm_moe_dsa": GlmMoeDsaConfig}


def config(variant: str):
    spec = {**BASE, **VARIANTS[variant]}
    return CONFIGS[spec.pop("arch")](**spec)


def _redraw(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            draw = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * draw)
            elif "embed_tokens" in name:
                p.copy_(draw)
            else:  # linear weights (2-D) and the stacked experts (3-D, [E, out, in])
                p.copy_(draw / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def write(variant: str, folder: Path, *, dtype=torch.float32, seed: int = 0, load_dtype=None):
    """Save the variant's model (random unit-scale weights, stored in ``dtype``) with transformers;
    returns it as transformers loads it back (``from_pretrained``, computing in ``load_dtype``,
    default ``dtype``)."""
    model = AutoModelForCausalLM.from_config(config(variant), dtype=torch.float32)
    _redraw(model, seed)
    model.to(dtype).save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=load_dtype or dtype).eval()


def write_dsa(variant: str, folder: Path, *, seed: int = 0):
    """:func:`write` for a model with a DSA indexer, its per-head indexer weights made positive: exact
    ties of the index scores (all heads' ReLUs zero), which top-k breaks arbitrarily and transformers
    itself then breaks differently for different sequence lengths, become as rare as in real models."""
    model = AutoModelForCausalLM.from_config(config(variant), dtype=torch.float32)
    _redraw(model, seed)
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.self_attn.indexer is not None:
                layer.self_attn.indexer.weights_proj.weight.abs_()
    model.save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def quantize_fp8(w: torch.Tensor, block=BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, float32 scale per block): each block scaled so its largest |value| maps to
    448, as DeepSeek-V3's FP8 checkpoints are made; ``weight ≈ fp8 * scale``."""
    rows, cols = w.shape
    b0, b1 = block
    grid = (-(-rows // b0), -(-cols // b1))
    padded = torch.zeros(grid[0] * b0, grid[1] * b1)
    padded[:rows, :cols] = w.float()
    blocks = padded.view(grid[0], b0, grid[1], b1)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).view(grid[0] * b0, grid[1] * b1)[:rows, :cols]
    return q.to(torch.float8_e4m3fn), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block=BLOCK) -> torch.Tensor:
    b0, b1 = block
    full = scale.repeat_interleave(b0, 0).repeat_interleave(b1, 1)
    return q.float() * full[: q.shape[0], : q.shape[1]]


def quantized(name: str) -> bool:
    """Whether a real FP8 DeepSeek-V3 checkpoint stores ``name`` in FP8 (linear weights of
    attention, MLPs and experts; not embeddings, the LM head, norms or the router)."""
    return name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight")


def to_fp8(folder: Path, out: Path, model) -> None:
    """Rewrite checkpoint ``folder`` (written from bf16 weights) as an FP8 block-scaled one in
    ``out``, and set ``model``'s weights to the dequantized values (what the FP8 file means)."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    written, meant = {}, {}
    for name, t in tensors.items():
        if quantized(name):
            q, scale = quantize_fp8(t)
            written[name], written[name + "_scale_inv"] = q, scale
            meant[name] = dequantize_fp8(q, scale)
        else:
            written[name] = t
    save_file(written, str(out / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(BLOCK)}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    # transformers holds experts stacked [E, 2I, d] / [E, d, I]; load the dequantized ones by name
    state = model.state_dict()
    with torch.no_grad():
        for name, value in meant.items():
            if name in state:
                state[name].copy_(value.to(state[name].dtype))
            else:  # model.layers.L.mlp.experts.J.{gate,up,down}_proj.weight
                stack, j, proj, _ = name.rsplit(".", 3)
                j = int(j)
                if proj == "down_proj":
                    state[f"{stack}.down_proj"][j].copy_(value.to(state[f"{stack}.down_proj"].dtype))
                else:
                    gate_up = state[f"{stack}.gate_up_proj"]
                    half = gate_up.shape[1] // 2
                    rows = slice(0, half) if proj == "gate_proj" else slice(half, 2 * half)
                    gate_up[j, rows].copy_(value.to(gate_up.dtype))


@torch.no_grad()
def greedy(model, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation of ``prompt`` (``generate``, no stop token) and the float32
    logits [len(prompt) + new_tokens - 1, V] of every position that predicts one (one forward
    over the whole sequence, whose argmax must give the same tokens)."""
    model.generation_config.eos_token_id = None
    ids = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=0)[0].tolist()
    logits = model(torch.tensor([ids[:-1]])).logits[0].float()
    assert logits[len(prompt) - 1:].argmax(-1).tolist() == ids[len(prompt):], "cached and full forwards disagree"
    return ids[len(prompt):], logits
