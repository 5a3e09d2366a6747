"""The GLM-5 checkpoint family (``GlmMoeDsaForCausalLM``, transformers' ``glm_moe_dsa``): DeepSeek-V3.2's
MLA (interleaved rotary), DeepSeek Sparse Attention and DeepSeek-V3's sigmoid, bias-corrected,
group-limited MoE router, with three differences, all carried into the profile's
:class:`~splash_core.profiles.model.IndexerConfig`:

- ``indexer_types`` says per layer whether it runs its own indexer ("full") or reuses the previous
  full layer's top-k ("shared": it stores no indexer tensors); the first layer must be full. Where
  it is absent, transformers derives it from ``index_topk_pattern`` (a string of F/S or a list)
  or else ``index_topk_freq``/``index_skip_topk_offset``, and so does this reader; where both are
  given, they must agree (transformers reads only ``indexer_types``);
- the indexer rotates interleaved pairs (V3.2's rotates halves);
- which layers are MoE is ``mlp_layer_types`` (default ``first_k_dense_replace`` = 3 dense ones);
  a ``first_k_dense_replace`` that disagrees with it is refused, as for GLM-4.7-Flash.

Indexer keys are stored at full precision (the weights' format, no scales), as for V3.2. MTP layers
are ignored as for DeepSeek-V3 (see :mod:`~splash_core.profiles.checkpoint_deepseek`).
"""

from __future__ import annotations

from .checkpoint_deepseek_v32 import indexer_fields, normalize_dsa
from .checkpoint_family import CheckpointError, CheckpointFamily

_PATTERN_KEYS = ("index_topk_pattern", "index_topk_freq", "index_skip_topk_offset")


def _derived_indexer_types(c: dict, layers: int, file: str) -> list | None:
    """transformers' ``indexer_types`` from the pattern keys (None where none is given)."""
    if not any(c.get(key) is not None for key in _PATTERN_KEYS):
        return None
    pattern = c.get("index_topk_pattern")
    if pattern is not None:
        letters = {"F": "full", "S": "shared"}
        if isinstance(pattern, str) and set(pattern) <= set(letters):
            return [letters[ch] for ch in pattern]
        if isinstance(pattern, list):
            return list(pattern)
        raise CheckpointError(file, "index_topk_pattern", "expected a string of F/S or a list", pattern)
    freq, offset = max(c.get("index_topk_freq") or 1, 1), c.get("index_skip_topk_offset")
    offset = 2 if offset is None else offset
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]


def _indexer_types(c: dict, layers: int, file: str) -> list:
    given, derived = c.get("indexer_types"), _derived_indexer_types(c, layers, file)
    if given is not None and derived is not None and list(given) != derived:
        key = next(k for k in _PATTERN_KEYS if c.get(k) is not None)
        raise CheckpointError(file, key, f"disagrees with indexer_types {given}", c[key])
    types = given if given is not None else derived if derived is not None else ["full"] * layers
    if not isinstance(types, list) or len(types) != layers:
        raise CheckpointError(file, "indexer_types", f"expected a list of {layers} 'full'/'shared'", types)
    for i, t in enumerate(types):
        if t not in ("full", "shared"):
            raise CheckpointError(file, f"indexer_types[{i}]", "expected 'full' or 'shared'", t)
    if types[0] != "full":
        raise CheckpointError(file, "indexer_types[0]", "the first layer has no earlier top-k to share", types[0])
    return types


def _normalize(c: dict, file: str) -> dict:
    return {**normalize_dsa(c, file, "GLM-5"), "indexer_types": _indexer_types(c, c["num_hidden_layers"], file)}


def _indexer(c: dict, file: str) -> dict:
    shared = [i for i, t in enumerate(c["indexer_types"]) if t == "shared"]
    return indexer_fields(c, file, shared_layers=shared, rope_interleave=True)


GLM_MOE_DSA = CheckpointFamily(
    kind="glm_moe_dsa",
    defaults=dict(vocab_size=154880, hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048,
                  num_hidden_layers=78, num_attention_heads=64, n_shared_experts=1, n_routed_experts=256,
                  routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=2048, qk_rope_head_dim=64,
                  v_head_dim=256, qk_nope_head_dim=192, n_group=1, topk_group=1, num_experts_per_tok=8,
                  norm_topk_prob=True, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
                  first_k_dense_replace=3, index_topk=2048, index_head_dim=128, index_n_heads=32),
    reads=frozenset({"index_topk", "index_head_dim", "index_n_heads", "layer_types", "mlp_layer_types",
                     "first_k_dense_replace", "indexer_types", "num_nextn_predict_layers", *_PATTERN_KEYS}),
    normalize=_normalize,
    extra_fields=_indexer,
)
