"""Model profiles: attention dims, layer kinds and storage formats (DESIGN.md §5)."""

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


@dataclasses.dataclass(frozen=True)
class IndexerConfig:
    """Sparse-attention indexer (DeepSeek-V3.2 DSA): one key of head_dim per token per layer."""

    heads: int = field("indexer query heads", checks=[positive])
    head_dim: int = field("indexer key width per token", checks=[positive])
    topk: int = field("tokens selected per query", checks=[positive])
    dtype: str = field("storage format of indexer keys", default="fp8", checks=[_DTYPE])
    scale_bytes: int = field("bytes of quantization scale per token per layer", default=0, checks=[non_negative])


@dataclasses.dataclass(frozen=True)
class KDAConfig:
    """Kimi delta attention layer: recurrent state [H, K, V] per request plus short-conv caches."""

    heads: int = field("KDA heads", checks=[positive])
    head_dim: int = field("key/value width per head", checks=[positive])
    conv_size: int = field("short-convolution kernel width", default=4, checks=[positive])
    state_dtype: str = field("format of the recurrent state", default="fp32", checks=[_DTYPE])


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
    vocab_size: int = field("vocabulary size (runtime embedding / LM head)", default=32000, checks=[positive])
    intermediate_size: int = field("dense MLP width (runtime)", default=0, checks=[non_negative])
    rms_norm_eps: float = field("RMSNorm epsilon", default=1e-6, checks=[positive])
    rope_theta: float = field("RoPE base", default=10000.0, checks=[positive])
    source: str = field("where the dims come from (config URL, paper section)", default="")
    notes: str = field("caveats, e.g. where a stand-in disagrees with a paper figure", default="")

    def problems(self):
        kinds = set(self.layers.kinds)
        if LayerKind.MLA in kinds and self.mla is None:
            yield Problem("mla", "the layer pattern has mla layers but no mla dims are given")
        if LayerKind.KDA in kinds and self.kda is None:
            yield Problem("kda", "the layer pattern has kda layers but no kda dims are given")
        if self.indexer is not None and self.mla is None:
            yield Problem("indexer", "an indexer needs mla layers")

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

    @property
    def kv_bytes_per_token(self) -> int:
        """k of Eq 1: cache bytes per context token over all cache-bearing layers."""
        per_layer = self.kv_bytes_per_token_layer + self.indexer_bytes_per_token_layer
        return self.count(LayerKind.MLA) * per_layer

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
