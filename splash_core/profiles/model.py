"""Model profiles: attention dims, layer kinds and storage formats (docs/design.md §5)."""

from __future__ import annotations

import dataclasses
import enum
import functools

from .. import dtypes
from .schema import Problem, field, non_negative, one_of, positive

_DTYPE = one_of(*dtypes.NAMES)


class LayerKind(str, enum.Enum):
    """Kinds of attention layer a model may stack."""

    MLA = "mla"  # multi-head latent attention: paged latent KV (+ optional indexer keys)
    KDA = "kda"  # Kimi delta attention: per-request recurrent state + short-conv caches

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class MLAConfig:
    """Dims of one MLA layer (DeepSeek naming)."""

    heads: int = field("attention heads H", checks=[positive])
    q_lora_rank: int = field("query low-rank width r_q (0: queries projected directly)", checks=[non_negative])
    kv_lora_rank: int = field("latent width d_c", checks=[positive])
    qk_nope_head_dim: int = field("per-head non-rotary query/key width d_n", checks=[positive])
    qk_rope_head_dim: int = field("rotary width d_r (shared rotary key)", checks=[positive])
    v_head_dim: int = field("per-head value width d_v", checks=[positive])
    # DeepSeek's and transformers' Q and KV latent norms keep the RMSNorm default, whatever rms_norm_eps says
    latent_norm_eps: float = field("RMSNorm epsilon of the query and KV latents", default=1e-6, checks=[positive])


@dataclasses.dataclass(frozen=True)
class IndexerConfig:
    """Sparse-attention indexer (DeepSeek-V3.2 DSA): one key of head_dim per token per layer."""

    heads: int = field("indexer query heads", checks=[positive])
    head_dim: int = field("indexer key width per token", checks=[positive])
    topk: int = field("tokens selected per query", checks=[positive])
    dtype: str = field("storage format of indexer keys", default="fp8", checks=[_DTYPE])
    scale_bytes: int = field("bytes of quantization scale per token per layer", default=0, checks=[non_negative])
    shared_layers: tuple[int, ...] = field(
        "layers without an indexer of their own, reusing the previous full layer's top-k (GLM-5)", default=())
    rope_interleave: bool = field(
        "the indexer rotates interleaved pairs of its rotary channels (GLM-5), not halves (DeepSeek-V3.2)",
        default=False)

    def problems(self):
        if 0 in self.shared_layers or any(i < 0 for i in self.shared_layers):
            yield Problem("shared_layers", "the first layer has no earlier top-k to share: it needs its own indexer",
                          list(self.shared_layers))

    def selects(self, layer: int) -> bool:
        """Whether layer ``layer`` runs its own indexer (else it reuses the previous full layer's top-k)."""
        return layer not in self.shared_layers


@dataclasses.dataclass(frozen=True)
class KDAConfig:
    """Kimi delta attention layer: recurrent state [H, K, V] per request plus short-conv caches."""

    heads: int = field("KDA heads", checks=[positive])
    head_dim: int = field("key/value width per head", checks=[positive])
    conv_size: int = field("short-convolution kernel width", default=4, checks=[positive])
    state_dtype: str = field("format of the recurrent state", default="fp32", checks=[_DTYPE])


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Routed experts of the feed-forward blocks (DeepSeek-V2/V3 naming): the first
    ``first_k_dense_replace`` layers keep a dense MLP of ``intermediate_size``; every later one
    routes each token to ``num_experts_per_tok`` of ``n_routed_experts`` experts and adds
    ``n_shared_experts`` always-on experts, all of width ``moe_intermediate_size``."""

    n_routed_experts: int = field("routed experts per MoE layer", checks=[positive])
    num_experts_per_tok: int = field("routed experts each token uses (top-k)", checks=[positive])
    moe_intermediate_size: int = field("width of one expert's MLP", checks=[positive])
    n_shared_experts: int = field("always-on shared experts per MoE layer", default=0, checks=[non_negative])
    first_k_dense_replace: int = field("leading layers with a dense MLP instead of experts", default=0,
                                       checks=[non_negative])
    scoring_func: str = field("router scores: sigmoid (V3) or softmax (V2)", default="softmax",
                              checks=[one_of("softmax", "sigmoid")])
    topk_method: str = field(
        "expert choice: greedy (top-k of all), group_limited_greedy (V2: groups ranked by their best "
        "score) or noaux_tc (V3: scores plus e_score_correction_bias, groups ranked by their top-2 sum)",
        default="greedy", checks=[one_of("greedy", "group_limited_greedy", "noaux_tc")])
    n_group: int = field("expert groups for grouped top-k (1: plain top-k)", default=1, checks=[positive])
    topk_group: int = field("groups each token may pick experts from", default=1, checks=[positive])
    norm_topk_prob: bool = field("renormalise the chosen experts' weights to sum to 1", default=False)
    routed_scaling_factor: float = field("scale of the routed experts' sum", default=1.0, checks=[positive])

    def problems(self):
        if self.num_experts_per_tok > self.n_routed_experts:
            yield Problem("num_experts_per_tok", f"exceeds n_routed_experts ({self.n_routed_experts})",
                          self.num_experts_per_tok)
        if self.n_routed_experts % self.n_group:
            yield Problem("n_group", f"must divide n_routed_experts ({self.n_routed_experts})", self.n_group)
        if self.topk_group > self.n_group:
            yield Problem("topk_group", f"exceeds n_group ({self.n_group})", self.topk_group)
        if self.topk_method == "noaux_tc" and self.n_routed_experts // self.n_group < 2:
            yield Problem("n_group", "noaux_tc ranks groups by their top-2 scores: groups need >= 2 experts",
                          self.n_group)
        if self.topk_method != "greedy" and self.topk_group * (self.n_routed_experts // self.n_group) \
                < self.num_experts_per_tok:
            yield Problem("topk_group", f"the chosen groups hold fewer than num_experts_per_tok "
                                        f"({self.num_experts_per_tok}) experts", self.topk_group)


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """YaRN rotary scaling (``rope_scaling`` of DeepSeek's config.json, ``type: yarn``): frequencies
    interpolated by ``factor`` below the correction range set by ``beta_fast``/``beta_slow``
    (rounded to whole dims, as DeepSeek does), cos/sin scaled by mscale(factor, mscale) /
    mscale(factor, mscale_all_dim), and the softmax scale by mscale(factor, mscale_all_dim)²,
    where mscale(s, m) = 0.1 m ln s + 1."""

    factor: float = field("context extension factor s", checks=[positive])
    original_max_position_embeddings: int = field("context length of pre-training", checks=[positive])
    beta_fast: float = field("rotations where extrapolation ends", default=32.0, checks=[positive])
    beta_slow: float = field("rotations where interpolation starts", default=1.0, checks=[positive])
    mscale: float = field("m of the cos/sin scale's numerator", default=1.0, checks=[non_negative])
    mscale_all_dim: float = field("m of its denominator and of the softmax correction (0: none)", default=0.0,
                                  checks=[non_negative])


@dataclasses.dataclass(frozen=True)
class KVCacheFormat:
    """How one token's MLA cache entry is stored per layer."""

    latent_dtype: str = field("format of the d_c latent", checks=[_DTYPE])
    rope_dtype: str = field("format of the d_r rotary key", checks=[_DTYPE])
    scale_bytes: int = field("bytes of quantization scales per token per layer", default=0, checks=[non_negative])


@dataclasses.dataclass(frozen=True)
class LayerStack:
    """``count`` layers whose kinds repeat ``pattern`` cyclically (e.g. [kda, kda, kda, mla])."""

    count: int = field("number of layers", checks=[positive])
    pattern: tuple[LayerKind, ...] = field("layer kinds, repeated cyclically", default=(LayerKind.MLA,))

    def problems(self):
        if not self.pattern:
            yield Problem("pattern", "needs at least one layer kind", list(self.pattern))

    @functools.cached_property
    def kinds(self) -> tuple[LayerKind, ...]:
        return tuple(self.pattern[i % len(self.pattern)] for i in range(self.count))


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """A model as SPLASH sees it: attention dims and storage formats, plus what the runtime's
    small model needs (vocab, MLP width)."""

    profile_kind = "model"

    name: str = field("profile name")
    hidden_size: int = field("hidden width d", checks=[positive])
    layers: LayerStack = field("layer count and kinds")
    mla: MLAConfig | None = field("MLA dims (required if any layer is mla)", default=None)
    kda: KDAConfig | None = field("KDA dims (required if any layer is kda)", default=None)
    indexer: IndexerConfig | None = field("sparse-attention indexer (None: dense MLA)", default=None)
    kv_cache: KVCacheFormat = field(
        "MLA cache format", default=KVCacheFormat(latent_dtype="bf16", rope_dtype="bf16")
    )
    weight_dtype: str = field("format of attention projection weights", default="bf16", checks=[_DTYPE])
    weight_scale_block: tuple[int, ...] | None = field(
        "[rows, cols] of one float32 scale block of FP8 block-scaled attention projections (an FP8 checkpoint's "
        "weight_block_size): Eq 9 counts these scales (S_meta) where weight_dtype is fp8. None: not counted, "
        "as the paper's own 143.5 MiB 'before scales'", default=None)
    vocab_size: int = field("vocabulary size (runtime embedding / LM head)", default=32000, checks=[positive])
    intermediate_size: int = field("dense MLP width (runtime)", default=0, checks=[non_negative])
    moe: MoEConfig | None = field("routed experts (None: a dense MLP in every layer)", default=None)
    rms_norm_eps: float = field("RMSNorm epsilon", default=1e-6, checks=[positive])
    rope_theta: float = field("RoPE base", default=10000.0, checks=[positive])
    rope_scaling: RopeScaling | None = field("YaRN scaling of the rotary frequencies (None: plain RoPE)", default=None)
    mla_rope: bool = field(
        "MLA layers rotate their d_r channels by position (False: Kimi-Linear's MLA, which encodes no "
        "position: the shared d_r key channels attend unrotated)", default=True)
    rope_interleave: bool = field(
        "the checkpoint's rotary channels are interleaved pairs (DeepSeek's layout); the loader permutes "
        "them into the rotate-half order the runtime computes in", default=False)
    checkpoint: str = field("Hugging Face checkpoint folder the runtime reads weights from "
                            "('': weights drawn from the deployment's seed)", default="")
    builtin: str = field("the tiny checkpoint SPLASH writes into ``checkpoint`` on first use "
                         "(splash_core.profiles.builtin_checkpoints; '': none)", default="")
    runtime_experts: bool = field(
        "whether the runtime's model builds the routed experts of ``moe`` (False: a dense MLP of "
        "intermediate_size in every layer, the attention benchmarks' stand-in; the cost model still "
        "sees ``moe``)", default=True)
    source: str = field("where the dims come from (config URL, paper section)", default="")
    notes: str = field("caveats, e.g. where a stand-in disagrees with a paper figure", default="")

    def problems(self):
        block = self.weight_scale_block
        if block is not None and not (len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
            yield Problem("weight_scale_block", "expected [rows, cols], two positive integers", list(block))
        kinds = set(self.layers.kinds)
        if LayerKind.MLA in kinds and self.mla is None:
            yield Problem("mla", "the layer pattern has mla layers but no mla dims are given")
        if LayerKind.KDA in kinds and self.kda is None:
            yield Problem("kda", "the layer pattern has kda layers but no kda dims are given")
        if self.indexer is not None and self.mla is None:
            yield Problem("indexer", "an indexer needs mla layers")
        if self.moe is not None and self.moe.first_k_dense_replace > self.layers.count:
            yield Problem("moe.first_k_dense_replace", f"exceeds the layer count ({self.layers.count})",
                          self.moe.first_k_dense_replace)

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based) routes to experts rather than a dense MLP."""
        return self.moe is not None and index >= self.moe.first_k_dense_replace

    def runtime_moe_layer(self, index: int) -> bool:
        """Whether the runtime's model builds routed experts in layer ``index``."""
        return self.runtime_experts and self.is_moe_layer(index)

    # ---- derived sizes (bytes) --------------------------------------------------------

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        return self.layers.kinds

    @property
    def num_layers(self) -> int:
        return self.layers.count

    def count(self, kind: LayerKind) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """MLA latent + rotary key (+ scales) of one token in one layer."""
        if self.mla is None:
            return 0
        f = self.kv_cache
        return (
            self.mla.kv_lora_rank * dtypes.nbytes(f.latent_dtype)
            + self.mla.qk_rope_head_dim * dtypes.nbytes(f.rope_dtype)
            + f.scale_bytes
        )

    @property
    def indexer_bytes_per_token_layer(self) -> int:
        if self.indexer is None:
            return 0
        return self.indexer.head_dim * dtypes.nbytes(self.indexer.dtype) + self.indexer.scale_bytes

    def stores_indexer_keys(self, layer: int) -> bool:
        """Whether layer ``layer`` caches an indexer key per token: an MLA layer running its own
        indexer (GLM-5's shared-indexer layers reuse an earlier top-k and store none)."""
        return (self.indexer is not None and self.layer_kinds[layer] is LayerKind.MLA
                and self.indexer.selects(layer))

    def cache_bytes_per_token_at(self, layer: int) -> int:
        """Cache bytes per context token of layer ``layer``: latent + rotary key, plus the indexer
        key where it stores one (0 for a KDA layer)."""
        if self.layer_kinds[layer] is not LayerKind.MLA:
            return 0
        return self.kv_bytes_per_token_layer + self.indexer_bytes_per_token_layer * self.stores_indexer_keys(layer)

    def cache_bytes_per_token_over(self, layers) -> int:
        """:meth:`cache_bytes_per_token_at` summed over ``layers`` (indices)."""
        return sum(self.cache_bytes_per_token_at(i) for i in layers)

    @property
    def kv_bytes_per_token(self) -> int:
        """k of Eq 1: cache bytes per context token over all cache-bearing layers (the indexer keys
        only of the layers that store them)."""
        return self.cache_bytes_per_token_over(range(self.num_layers))

    @property
    def recurrent_bytes_per_request_layer(self) -> int:
        """KDA state [H, K, V] plus q/k/v short-conv caches of one request in one layer."""
        if self.kda is None:
            return 0
        k = self.kda
        b = dtypes.nbytes(k.state_dtype)
        state = k.heads * k.head_dim * k.head_dim * b
        conv = 3 * k.heads * k.head_dim * (k.conv_size - 1) * b
        return state + conv

    @property
    def recurrent_bytes_per_request(self) -> int:
        return self.count(LayerKind.KDA) * self.recurrent_bytes_per_request_layer
