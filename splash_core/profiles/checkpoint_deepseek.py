"""The DeepSeek-V2 and -V3 checkpoint families (``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``;
also Kimi-K2 and Moonlight style folders), with transformers' defaults (DeepseekV2Config /
DeepseekV3Config) for keys a config leaves out.

MTP layers (``num_nextn_predict_layers``; tensors ``model.layers.N...`` past the last layer) are
loaded by nobody and ignored, which provably leaves outputs unchanged: DeepSeek-V3's MTP module
reads the main model's last hidden state and embeddings to predict one token further, and feeds
nothing back into the main model (transformers drops these tensors too); the load notes say so.
"""

from __future__ import annotations

from .checkpoint_family import CheckpointFamily

_MOE_ROUTING = frozenset({"first_k_dense_replace", "topk_method", "scoring_func", "moe_layer_freq"})


def _v2_normalize(c: dict, file: str) -> dict:
    """DeepSeek-V2 always rotates interleaved pairs, and its ``norm_topk_prob`` renormalises the
    chosen weights *instead of* scaling them by ``routed_scaling_factor`` (V3: before scaling)."""
    c = {**c, "rope_interleave": True}
    if c["norm_topk_prob"] and (c.get("num_experts_per_tok") or 0) > 1:
        c["routed_scaling_factor"] = 1.0
    return c


DEEPSEEK_V2 = CheckpointFamily(
    kind="deepseek_v2",
    defaults=dict(q_lora_rank=1536, n_group=None, topk_group=None, topk_method="greedy", scoring_func="softmax",
                  first_k_dense_replace=0, norm_topk_prob=False, routed_scaling_factor=1.0,
                  n_shared_experts=2, n_routed_experts=64, moe_intermediate_size=1407, num_experts_per_tok=None,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    reads=_MOE_ROUTING,
    normalize=_v2_normalize,
)

DEEPSEEK_V3 = CheckpointFamily(
    kind="deepseek_v3",
    defaults=dict(q_lora_rank=1536, n_group=8, topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid",
                  first_k_dense_replace=3, norm_topk_prob=True, routed_scaling_factor=2.5,
                  n_shared_experts=1, n_routed_experts=256, moe_intermediate_size=2048, num_experts_per_tok=8,
                  rope_interleave=True, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0,
                  eos_token_id=1),
    reads=_MOE_ROUTING | {"rope_interleave", "num_nextn_predict_layers"},
)
