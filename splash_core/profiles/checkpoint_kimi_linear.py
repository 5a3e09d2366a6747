"""The Kimi-Linear checkpoint family (``KimiLinearForCausalLM``, transformers' ``kimi_linear``): a
hybrid of MLA layers ("full_attention") and Kimi delta attention layers ("linear_attention"), each
with its own head count, over DeepSeek-V3's sigmoid, bias-corrected, group-limited MoE router.

Mapped here into the DeepSeek-V3 vocabulary and SPLASH's profile:

- which layer is which: ``layer_types``, else ``linear_attn_config``'s 1-based ``full_attn_layers``
  and ``kda_layers`` (the original checkpoints' spelling), else transformers' default (every fourth
  layer from layer 4 is MLA); the KDA dims from ``linear_num_heads``/``linear_head_dim``/
  ``linear_conv_kernel_dim`` or ``linear_attn_config``'s ``num_heads``/``head_dim``/
  ``short_conv_kernel_size``;
- the MoE keys' Kimi spellings (``num_experts``, ``num_experts_per_token``, ``num_expert_group``,
  ``moe_renormalize``, ``num_shared_experts``); which layers are MoE from ``mlp_layer_types``
  (else ``first_k_dense_replace``, default 1), dense layers only before the first MoE one;
- the MLA layers encode no position: transformers' Kimi-Linear never rotates the d_r key channels
  (``mla_rope: false``);
- the original config.json's keys that transformers ignores are accepted only at the values it
  computes with (``mla_use_nope: true``, sigmoid router scores, grouped top-k); MTP layers
  (``num_nextn_predict_layers``) are ignored as for DeepSeek-V3;
- stored tensor names (:func:`stored_name`): the original checkpoints' ``block_sparse_moe`` for
  ``mlp`` and ``w1``/``w2``/``w3`` for an expert's gate/down/up projections.
"""

from __future__ import annotations

import re

from .checkpoint_family import CheckpointError, CheckpointFamily, dense_mlp_prefix

# Kimi's spelling -> the DeepSeek-V3 key the common reader speaks (transformers' attribute_map)
_SPELLINGS = {"num_experts": "n_routed_experts", "num_local_experts": "n_routed_experts",
              "num_experts_per_token": "num_experts_per_tok", "num_expert_group": "n_group",
              "moe_renormalize": "norm_topk_prob", "num_shared_experts": "n_shared_experts"}
_LAYER_KINDS = {"full_attention": "mla", "linear_attention": "kda"}
_LINEAR_KEYS = {"head_dim": "linear_head_dim", "num_heads": "linear_num_heads",
                "short_conv_kernel_size": "linear_conv_kernel_dim"}
_EXPERT = re.compile(r"(model\.layers\.\d+\.)mlp(\.experts\.\d+\.)(gate|up|down)_proj(\.weight)")
_EXPERT_NAMES = {"gate": "w1", "down": "w2", "up": "w3"}
# keys of the original checkpoints' config.json that transformers does not read: the one value each may
# have is the one transformers computes (no rotary in MLA, sigmoid router scores over expert groups)
_MUST_BE = {"mla_use_nope": True, "moe_router_activation_func": "sigmoid", "use_grouped_topk": True}


def stored_name(name: str) -> str:
    """The name a Kimi-Linear checkpoint stores model tensor ``name`` under."""
    expert = _EXPERT.fullmatch(name)
    if expert:
        layer, index, proj, weight = expert.groups()
        return f"{layer}block_sparse_moe{index}{_EXPERT_NAMES[proj]}{weight}"
    return re.sub(r"^(model\.layers\.\d+\.)mlp\.", r"\1block_sparse_moe.", name)


def _layer_types(c: dict, file: str) -> list[str]:
    layers, linear = c["num_hidden_layers"], c.get("linear_attn_config") or {}
    types = c.get("layer_types")
    if types is None and "full_attn_layers" in linear and "kda_layers" in linear:
        types = [None] * layers
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for i in linear[key]:
                if not (isinstance(i, int) and 1 <= i <= layers):
                    raise CheckpointError(file, f"linear_attn_config.{key}", f"expected 1-based layers 1..{layers}", i)
                types[i - 1] = kind
    if types is None:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise CheckpointError(file, "layer_types", f"expected a list of {layers} layer types", types)
    for i, t in enumerate(types):
        if t not in _LAYER_KINDS:
            raise CheckpointError(file, f"layer_types[{i}]", f"expected one of {', '.join(_LAYER_KINDS)}", t)
    return types


def _dense_prefix(c: dict, file: str) -> int:
    layers, first = c["num_hidden_layers"], c.get("first_k_dense_replace", 1)
    types = c.get("mlp_layer_types")
    return dense_mlp_prefix(["dense" if i < first else "sparse" for i in range(layers)] if types is None else types,
                            layers, file)


def _normalize(c: dict, file: str) -> dict:
    c = dict(c)
    for key, want in _MUST_BE.items():
        if c.get(key, want) != want:
            raise CheckpointError(file, key, f"Kimi-Linear (as transformers) runs {key} = {want!r}", c[key])
    for kimi, deepseek in _SPELLINGS.items():
        if kimi in c:
            c[deepseek] = c.pop(kimi)
    linear = c.get("linear_attn_config") or {}
    unknown = sorted(set(linear) - set(_LINEAR_KEYS) - {"full_attn_layers", "kda_layers"})
    if unknown:
        raise CheckpointError(file, f"linear_attn_config.{unknown[0]}", "not supported by SPLASH's kimi_linear reader",
                              linear[unknown[0]])
    for key, flat in _LINEAR_KEYS.items():
        if key in linear:
            c[flat] = linear[key]
    return {**c, "first_k_dense_replace": _dense_prefix(c, file), "topk_method": "noaux_tc",
            "scoring_func": "sigmoid", "rope_interleave": False}


def _extra_fields(c: dict, file: str) -> dict:
    for key in _LINEAR_KEYS.values():
        if not isinstance(c.get(key), int) or c[key] <= 0:
            raise CheckpointError(file, key, "required positive integer", c.get(key))
    types = _layer_types(c, file)
    return {"layers": {"count": len(types), "pattern": [_LAYER_KINDS[t] for t in types]},
            "kda": {"heads": c["linear_num_heads"], "head_dim": c["linear_head_dim"],
                    "conv_size": c["linear_conv_kernel_dim"], "state_dtype": "fp32"},
            "mla_rope": False}


KIMI_LINEAR = CheckpointFamily(
    kind="kimi_linear",
    # KimiLinearConfig's defaults
    defaults=dict(vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
                  num_hidden_layers=27, num_attention_heads=32, n_shared_experts=1, routed_scaling_factor=2.446,
                  kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                  n_group=1, topk_group=1, num_experts_per_tok=8, norm_topk_prob=True, rms_norm_eps=1e-5,
                  bos_token_id=163584, eos_token_id=163586, tie_word_embeddings=False, n_routed_experts=256,
                  linear_head_dim=128, linear_num_heads=32, linear_conv_kernel_dim=4),
    reads=frozenset({*_SPELLINGS, *_MUST_BE, "num_nextn_predict_layers", "moe_layer_freq", "layer_types",
                     "mlp_layer_types", "first_k_dense_replace", "linear_attn_config", "linear_head_dim",
                     "linear_num_heads", "linear_conv_kernel_dim"}),
    inert=frozenset({"model_max_length"}),
    normalize=_normalize,
    extra_fields=_extra_fields,
    stored_name=stored_name,
)
