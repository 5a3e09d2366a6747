"""The head-indexed projections of a layer kind: their names, shapes and bytes, derived from the
model's dims (what Eq 9 sizes, what a switch moves, what a replicated layout holds whole).

MLA (DeepSeek naming; d hidden, H heads, r_q query rank, d_c latent, d_n/d_r/d_v widths)::

    q_b   r_q x H(d_n + d_r)     (d x H(d_n + d_r) when r_q == 0: queries projected directly)
    kv_b  d_c x H(d_n + d_v)
    o     H d_v x d

KDA (Kimi-Linear naming; H heads of width K = V = head_dim, conv width c)::

    q, k, v   d x H K            o      H V x d
    beta      d x H              f_b    K x H K     (decay-gate up-projection)
    g_b       V x H V            decay  H + H K     (A_log and dt_bias)

Everything replicated in every layout (Q-A, KV-A, the rotary key rows, norms, KDA's low-rank
gate down-projections and its short-convolution taps) is not one of them (appendix A).

Kept FP8 block-scaled (``scale_block``: the checkpoint's (rows, cols) block of the stored [out, in]
weight), a projection's bytes include its float32 scale per block, and a head shard's those of
the blocks it touches: where shards start inside a block (tiny models; DeepSeek's at T = 8 align
to 128) neighbours share the boundary block, and a shard counts the most blocks any rank's shard
touches (what a switch's all-gather sends per rank: :mod:`splash_core.runtime.switch.weights_mover`).
"""

from __future__ import annotations

import dataclasses

from .. import dtypes
from .model import LayerKind, ModelProfile


@dataclasses.dataclass(frozen=True)
class Projection:
    """One head-indexed projection of one layer."""

    name: str
    kind: LayerKind
    shape: tuple[int, ...]  # elements, (in, out) for matrices
    heads: int  # the head axis it is sharded along
    dtype: str  # transfer format
    head_axis: int = 1  # the index in ``shape`` split by heads (O: its input)
    scale_block: tuple[int, int] | None = None  # FP8 block-scaled: (rows, cols) of the stored [out, in] blocks

    @property
    def params(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    @property
    def bytes(self) -> int:
        return self.params * dtypes.nbytes(self.dtype) + 4 * self._scale_blocks(1)

    def shard_bytes(self, T: int) -> int:
        """Bytes of one of T head shards (kept FP8: the largest); ValueError if T does not divide the heads."""
        check_divides(T, self.heads, f"{self.kind} heads")
        return self.params * dtypes.nbytes(self.dtype) // T + 4 * self._scale_blocks(T)

    def _scale_blocks(self, T: int) -> int:
        """Scale blocks of the head shard of T touching the most blocks (0 unless kept FP8)."""
        if self.scale_block is None:
            return 0
        per_axis = (self.scale_block[1], self.scale_block[0])  # shape is (in, out): columns, then rows
        n, b = self.shape[self.head_axis] // T, per_axis[self.head_axis]
        other = -(-self.shape[1 - self.head_axis] // per_axis[1 - self.head_axis])
        return other * max(-(-((r * n) % b + n) // b) for r in range(T))


def check_divides(T: int, heads: int, what: str) -> None:
    if T < 1:
        raise ValueError(f"T must be >= 1 (got {T})")
    if heads % T:
        raise ValueError(f"T = {T} does not divide the model's {heads} {what}")


def projections(model: ModelProfile, kind: LayerKind, dtype: str | None = None,
                scale_block: tuple[int, int] | None = None) -> tuple[Projection, ...]:
    """The head-indexed projections of one layer of ``kind``, in order; () if the model has
    no dims for that kind. ``dtype`` defaults to the model's weight format; ``scale_block``:
    MLA's kept FP8 block-scaled in blocks of that many (rows, cols), their scales counted (default:
    the model's ``weight_scale_block`` where the format is fp8)."""
    dtype = dtype or model.weight_dtype
    if scale_block is None and dtype == "fp8" and model.weight_scale_block is not None:
        scale_block = tuple(model.weight_scale_block)
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
        heads, blocks = m.heads, scale_block
    elif kind is LayerKind.KDA and model.kda is not None:
        k = model.kda
        h, w = k.heads, k.head_dim
        rows = [
            ("q", (d, h * w)), ("k", (d, h * w)), ("v", (d, h * w)), ("o", (h * w, d)),
            ("beta", (d, h)), ("f_b", (w, h * w)), ("g_b", (w, h * w)), ("decay", (h * (1 + w),)),
        ]
        heads, blocks = h, None
    else:
        return ()
    return tuple(Projection(name, kind, shape, heads, dtype, 0 if name == "o" else 1, blocks)
                 for name, shape in rows)


def layer_weight_bytes(model: ModelProfile, kind: LayerKind, dtype: str | None = None) -> int:
    """S_A,k of Eq 9: bytes of one layer's head-indexed projections."""
    return sum(p.bytes for p in projections(model, kind, dtype))
