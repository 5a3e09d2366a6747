"""What one checkpoint family (one ``architectures`` name of config.json) contributes to the
reading of its folders: its defaults, the config keys it reads, the keys it knows do not change
outputs, and how its config and tensors map onto SPLASH's model profile.

Strictness lives here: a config key that neither SPLASH's common reader
(:data:`COMMON_READS`, :data:`COMMON_INERT`) nor the family names is refused, as is a stored
tensor that neither the model reads nor the family declares inert (see
:func:`~splash_core.checkpoint.source.CheckpointWeights`): nothing is dropped silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

from .schema import ProfileError

# keys the common reader turns into the profile (checkpoint_config.profile_fields)
COMMON_READS = frozenset({
    "architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
    "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "vocab_size", "intermediate_size",
    "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
    "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id", "torch_dtype", "dtype",
    "quantization_config", "hidden_act", "attention_bias", "mlp_bias", "pretraining_tp", "num_key_value_heads",
    "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "norm_topk_prob",
    "routed_scaling_factor", "n_group", "topk_group",
})
# keys that do not change a forward pass at inference: bookkeeping, training-only settings,
# output switches, ids of labels/padding, and dims transformers derives from the ones read
COMMON_INERT = frozenset({
    "_name_or_path", "transformers_version", "auto_map", "initializer_range", "use_cache", "attention_dropout",
    "output_attentions", "output_hidden_states", "output_router_logits", "return_dict", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "pad_token_id", "tokenizer_class",
    "aux_loss_alpha", "seq_aux", "router_aux_loss_coef", "ep_size", "head_dim", "qk_head_dim",
})
# tensors a checkpoint may hold that no forward pass reads (rotary tables recomputed from config)
COMMON_INERT_TENSORS = (re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"),)


class CheckpointError(ProfileError):
    """A checkpoint SPLASH cannot serve: names the file, the key or tensor, and why (one line)."""


@dataclass(frozen=True)
class CheckpointFamily:
    """One family of checkpoints. ``normalize`` maps a config (with ``defaults`` applied) into the
    DeepSeek-V3 vocabulary the common reader speaks (e.g. GLM's ``mlp_layer_types`` into
    ``first_k_dense_replace``); ``extra_fields`` adds profile fields of the family's own (e.g. an
    indexer); ``inert_tensors`` are patterns of stored tensors known not to change outputs."""

    kind: str
    defaults: Mapping[str, object]
    reads: frozenset[str] = frozenset()
    inert: frozenset[str] = frozenset()
    normalize: Callable[[dict, str], dict] | None = None
    extra_fields: Callable[[dict, str], dict] | None = None
    inert_tensors: tuple[re.Pattern, ...] = field(default=())
    # the name a checkpoint of the family stores a model tensor under (None: the model's own names)
    stored_name: Callable[[str], str] | None = None

    def known_keys(self) -> frozenset[str]:
        return COMMON_READS | COMMON_INERT | self.reads | self.inert


def dense_mlp_prefix(types, layers: int, file: str) -> int:
    """How many leading layers ``mlp_layer_types`` makes dense (a list of 'dense'/'sparse', one per
    layer); SPLASH runs dense MLP layers only before the MoE ones, so a dense layer after them is refused."""
    if not isinstance(types, list) or len(types) != layers:
        raise CheckpointError(file, "mlp_layer_types", f"expected a list of {layers} 'dense'/'sparse'", types)
    for i, t in enumerate(types):
        if t not in ("dense", "sparse"):
            raise CheckpointError(file, f"mlp_layer_types[{i}]", "expected 'dense' or 'sparse'", t)
    dense = next((i for i, t in enumerate(types) if t == "sparse"), layers)
    if "dense" in types[dense:]:
        raise CheckpointError(file, f"mlp_layer_types[{types.index('dense', dense)}]",
                              "SPLASH runs dense MLP layers only before the first MoE layer", "dense")
    return dense
