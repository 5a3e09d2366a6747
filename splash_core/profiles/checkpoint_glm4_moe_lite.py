"""The GLM-4.7-Flash checkpoint family (``Glm4MoeLiteForCausalLM``, transformers' ``glm4_moe_lite``):
DeepSeek-V3's MLA and sigmoid, bias-corrected, group-limited MoE router, with two differences of
spelling, both mapped here into the DeepSeek-V3 vocabulary: which layers are MoE is the list
``mlp_layer_types`` ("dense"/"sparse" per layer; default one dense layer, then sparse), and the
router's method is fixed (``noaux_tc`` with sigmoid scores), so a ``topk_method`` or
``scoring_func`` saying otherwise is refused rather than ignored, as is a ``first_k_dense_replace``
that disagrees with ``mlp_layer_types`` (transformers reads only the latter). MTP layers are
ignored as for DeepSeek-V3 (see :mod:`~splash_core.profiles.checkpoint_deepseek`).
"""

from __future__ import annotations

from .checkpoint_family import CheckpointError, CheckpointFamily, dense_mlp_prefix


def _dense_prefix(c: dict, file: str) -> int:
    layers = c["num_hidden_layers"]
    types = c.get("mlp_layer_types")
    return dense_mlp_prefix(["dense"] + ["sparse"] * (layers - 1) if types is None else types, layers, file)


def _normalize(c: dict, file: str) -> dict:
    dense = _dense_prefix(c, file)
    for key, want in (("first_k_dense_replace", dense), ("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")):
        if c.get(key) is not None and c[key] != want:
            raise CheckpointError(file, key, f"GLM-4.7-Flash (as transformers) runs {key} = {want!r} here", c[key])
    return {**c, "first_k_dense_replace": dense, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}


GLM4_MOE_LITE = CheckpointFamily(
    kind="glm4_moe_lite",
    defaults=dict(vocab_size=154880, hidden_size=2048, intermediate_size=10240, moe_intermediate_size=1536,
                  num_hidden_layers=47, num_attention_heads=20, n_shared_experts=1, n_routed_experts=64,
                  routed_scaling_factor=1.8, kv_lora_rank=512, q_lora_rank=768, qk_rope_head_dim=64, v_head_dim=256,
                  qk_nope_head_dim=192, n_group=1, topk_group=1, num_experts_per_tok=4, norm_topk_prob=True,
                  rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
                  rope_interleave=True),
    reads=frozenset({"mlp_layer_types", "first_k_dense_replace", "topk_method", "scoring_func", "rope_interleave",
                     "num_nextn_predict_layers"}),
    normalize=_normalize,
)
