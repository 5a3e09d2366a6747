"""Weight transfer accounting (paper appendix A, Eq 9): the attention projections whose
placement changes between layouts, per layer kind, in a transfer format.

Only head-indexed projections change placement: TP and DOP hold head shard r of each on rank
r, DP and CP hold all of them. Everything replicated in every layout (Q-A, KV-A, the rotary
key rows, norms, KDA's low-rank gate down-projections and its short-convolution taps) is left
out, as appendix A says. The q/k/v convolution taps (3 H K c parameters, 0.05% of a
GLM-5.3-Flash KDA layer) are replicated because DOP's owner convolves every head of its rows with the conv cache
it holds, which needs the taps of every head.

MLA (DeepSeek naming; d hidden, H heads, r_q query rank, d_c latent, d_n/d_r/d_v widths)::

    q_b   r_q x H(d_n + d_r)     (d x H(d_n + d_r) when r_q == 0: queries projected directly)
    kv_b  d_c x H(d_n + d_v)
    o     H d_v x d

KDA (Kimi-Linear naming; H heads of width K = V = head_dim, conv width c)::

    q, k, v   d x H K            o      H V x d
    beta      d x H              f_b    K x H K     (decay-gate up-projection)
    g_b       V x H V            decay  H + H K     (A_log and dt_bias)

Sizes are parameters times the transfer format's bytes; quantization scales (S_meta of Eq 9)
are not counted because model profiles do not describe them.
"""

from __future__ import annotations

import dataclasses

from . import dtypes
from .profiles.model import LayerKind, ModelProfile

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Projection:
    """One head-indexed projection of one layer."""

    name: str
    kind: LayerKind
    shape: tuple[int, ...]  # elements, (in, out) for matrices
    heads: int  # the head axis it is sharded along
    dtype: str  # transfer format

    @property
    def params(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    @property
    def bytes(self) -> int:
        return self.params * dtypes.nbytes(self.dtype)

    def shard_bytes(self, T: int) -> int:
        """Bytes of one of T head shards; ValueError if T does not divide the heads."""
        check_divides(T, self.heads, f"{self.kind} heads")
        return self.bytes // T


def check_divides(T: int, heads: int, what: str) -> None:
    if T < 1:
        raise ValueError(f"T must be >= 1 (got {T})")
    if heads % T:
        raise ValueError(f"T = {T} does not divide the model's {heads} {what}")


def projections(model: ModelProfile, kind: LayerKind, dtype: str | None = None) -> tuple[Projection, ...]:
    """The head-indexed projections of one layer of ``kind``, in order; () if the model has
    no dims for that kind. ``dtype`` defaults to the model's weight format."""
    dtype = dtype or model.weight_dtype
    dtypes.nbytes(dtype)  # unknown formats fail here, naming the known ones
    d = model.hidden_size
    if kind is LayerKind.MLA and model.mla is not None:
        m = model.mla
        q_in = m.q_lora_rank or d
        rows = [
            ("q_b", (q_in, m.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim))),
            ("kv_b", (m.kv_lora_rank, m.heads * (m.qk_nope_head_dim + m.v_head_dim))),
            ("o", (m.heads * m.v_head_dim, d)),
        ]
        heads = m.heads
    elif kind is LayerKind.KDA and model.kda is not None:
        k = model.kda
        h, w = k.heads, k.head_dim
        rows = [
            ("q", (d, h * w)), ("k", (d, h * w)), ("v", (d, h * w)), ("o", (h * w, d)),
            ("beta", (d, h)), ("f_b", (w, h * w)), ("g_b", (w, h * w)), ("decay", (h * (1 + w),)),
        ]
        heads = h
    else:
        return ()
    return tuple(Projection(name, kind, shape, heads, dtype) for name, shape in rows)


def layer_weight_bytes(model: ModelProfile, kind: LayerKind, dtype: str | None = None) -> int:
    """S_A,k of Eq 9: bytes of one layer's head-indexed projections."""
    return sum(p.bytes for p in projections(model, kind, dtype))


@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """Eq 9 for one layer kind at group size T."""

    kind: LayerKind
    layers: int  # how many layers of this kind the model has
    projections: tuple[Projection, ...]
    T: int

    @property
    def layer_bytes(self) -> int:
        return sum(p.bytes for p in self.projections)

    @property
    def shard_bytes(self) -> int:
        """What a sharded layout (TP, DOP) holds per rank per layer."""
        return sum(p.shard_bytes(self.T) for p in self.projections)

    @property
    def received_per_rank(self) -> int:
        """(1 - 1/T) S: what one rank receives per layer in a sharded→replicated switch."""
        return self.layer_bytes - self.shard_bytes

    @property
    def received_by_group(self) -> int:
        """Every rank's receive counted once (appendix A's aggregate V_sum)."""
        return self.T * self.received_per_rank


@dataclasses.dataclass(frozen=True)
class WeightReport:
    """Eq 9 for every layer kind of a model: what ``splash weights`` prints."""

    model: str
    T: int
    dtype: str
    kinds: tuple[LayerWeights, ...]
    notes: str

    @property
    def model_bytes(self) -> int:
        """W_A: all head-indexed projections of all layers (what DP and CP hold per rank)."""
        return sum(k.layers * k.layer_bytes for k in self.kinds)

    @property
    def received_per_rank(self) -> int:
        """All layers of one sharded→replicated switch, per rank."""
        return sum(k.layers * k.received_per_rank for k in self.kinds)

    @property
    def received_by_group(self) -> int:
        return self.T * self.received_per_rank


def weight_report(model: ModelProfile, T: int, dtype: str | None = None) -> WeightReport:
    """Eq 9 accounting of ``model`` at group size ``T`` in ``dtype`` (default: the model's)."""
    dtype = dtype or model.weight_dtype
    kinds = []
    for kind in LayerKind:
        projs = projections(model, kind, dtype)
        count = model.count(kind)
        if projs and count:
            check_divides(T, projs[0].heads, f"{kind} heads")
            kinds.append(LayerWeights(kind, count, projs, T))
    return WeightReport(model.name, T, dtype, tuple(kinds), model.notes)
