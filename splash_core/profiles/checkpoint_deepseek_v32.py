"""The DeepSeek-V3.2 checkpoint family (``DeepseekV32ForCausalLM``, transformers' ``deepseek_v32``):
DeepSeek-V3's MLA and router plus DeepSeek Sparse Attention in every layer, whose indexer
(``index_n_heads`` heads of ``index_head_dim``, ``index_topk`` keys per query) becomes the
profile's :class:`~splash_core.profiles.model.IndexerConfig`, with its keys stored at full precision
(the weights' format, no scales). Its MLA rotary always interleaves pairs (transformers has no
switch for it); which layers are MoE is ``mlp_layer_types`` as transformers reads it, and every
entry of ``layer_types`` must be ``indexed_attention`` (the only kind V3.2 has). MTP layers are
ignored as for DeepSeek-V3 (see :mod:`~splash_core.profiles.checkpoint_deepseek`).
"""

from __future__ import annotations

from .checkpoint_family import CheckpointError, CheckpointFamily, dense_mlp_prefix

_INDEX_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def normalize_dsa(c: dict, file: str, name: str = "DeepSeek-V3.2") -> dict:
    """``c`` with the router, MoE layers and rotary of a DSA model (every layer ``indexed_attention``,
    dense MLP layers only before the MoE ones); ``name`` says whose rule a refusal quotes."""
    layers = c["num_hidden_layers"]
    kinds = c.get("layer_types") or ["indexed_attention"] * layers
    if kinds != ["indexed_attention"] * layers:
        raise CheckpointError(file, "layer_types", f"{name} has {layers} 'indexed_attention' layers", kinds)
    types = c.get("mlp_layer_types")
    if types is None:
        dense = min(c["first_k_dense_replace"], layers)
        types = ["dense"] * dense + ["sparse"] * (layers - dense)
    dense = dense_mlp_prefix(types, layers, file)
    if c.get("first_k_dense_replace") is not None and c["first_k_dense_replace"] != dense:
        raise CheckpointError(file, "first_k_dense_replace", f"disagrees with mlp_layer_types ({dense} dense)",
                              c["first_k_dense_replace"])
    return {**c, "first_k_dense_replace": dense, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "rope_interleave": True}


def indexer_fields(c: dict, file: str, **more) -> dict:
    """The profile's ``indexer`` from a DSA config (keys stored at the weights' precision), plus ``more``."""
    if c["index_head_dim"] < c["qk_rope_head_dim"]:
        raise CheckpointError(file, "index_head_dim", f"must hold the {c['qk_rope_head_dim']} rotary channels",
                              c["index_head_dim"])
    stored = c.get("torch_dtype") or c.get("dtype") or "bfloat16"
    return {"indexer": {"heads": c["index_n_heads"], "head_dim": c["index_head_dim"], "topk": c["index_topk"],
                        "dtype": _INDEX_DTYPES.get(stored, "bf16"), "scale_bytes": 0, **more}}


DEEPSEEK_V32 = CheckpointFamily(
    kind="deepseek_v32",
    defaults=dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                  num_hidden_layers=61, num_attention_heads=128, n_shared_experts=1, n_routed_experts=256,
                  routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                  v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8,
                  norm_topk_prob=True, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
                  first_k_dense_replace=3, index_topk=2048, index_head_dim=128, index_n_heads=64),
    reads=frozenset({"index_topk", "index_head_dim", "index_n_heads", "layer_types", "mlp_layer_types",
                     "first_k_dense_replace", "num_nextn_predict_layers"}),
    normalize=normalize_dsa,
    extra_fields=indexer_fields,
)
