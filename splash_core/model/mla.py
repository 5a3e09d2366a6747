"""The MLA block's math, layout-free: RMSNorm, RoPE, Q-A/Q-B, KV-A, absorbed queries, W_UV and O.

Absorbed MLA (DeepSeek-V2 §2.1.2): the per-head key up-projection W_UK is folded into the
query, ``q_lat = q_nope · W_UK`` [n, h, d_c], so attention scores are ``q_lat · c + q_rope · k_rope``
against the cached latent ``c`` and shared rotary key ``k_rope``; attention returns a
softmax-weighted latent [n, h, d_c] and the value up-projection W_UV plus O turn it into the
hidden width. Every function works on any subset of heads: given a head shard's weights it
computes that shard's queries and that shard's partial O output (to be summed over shards).

RoPE (:mod:`~splash_core.model.rotary`) rotates the first and second halves of the rotary
channels (the Hugging Face ``rotate_half`` convention), with base ``rope_theta`` and YaRN scaling
where the profile has it; softmax scale ``1/sqrt(d_n + d_r)`` (with YaRN's correction).

Host cost is part of the design: every layer of a step rotates the same positions, so the
rotation tables are a :class:`Rotary` made once per step; Q-A, KV-A and the indexer keys read
the same rows, so :meth:`MLAMath.project` applies them as one matmul; per-head products are
batched matmuls over heads.
"""

from __future__ import annotations

import dataclasses

import torch

from ..planning.attention_forms import MLADims
from ..profiles.deployment import FORMS
from ..profiles.model import LayerKind, ModelProfile
from .fp8_blocks import StackedFP8, joined
from .ops import KERNELS, rms_norm, rotate
from .rotary import Rotary, rope, softmax_scale
from .weights import WeightSource, head_shard, layer_prefix, layer_tensor_shapes

__all__ = ["MLAMath", "MLAWeights", "Rotary", "projection_names", "rms_norm", "rope"]


@dataclasses.dataclass
class MLAWeights:
    """Attention weights of one MLA layer on one rank: all heads (replicated) or a head shard.

    ``q_b``, ``kv_b`` and ``o`` (the projections sharded layouts split, W_A of paper Eq 1) hold
    only the heads in ``heads``; ``q_a``, ``kv_a``, the norms and the indexer key projection are
    small and every rank keeps them whole in every layout. :meth:`load` stores ``q_a``, ``kv_a``
    and ``indexer_wk`` as row blocks of one tensor, ``down``, so one matmul applies all three;
    weights built without it (``down`` None) are applied one by one. Whoever replaces one of the
    three replaces ``down`` with it (or sets it to None).

    Kept FP8 (:meth:`load` with ``fp8``, ``attention_weights: fp8``), ``q_b``, ``kv_b`` and ``o`` are
    :class:`~splash_core.model.fp8_blocks.StackedFP8` of one part each: this rank's slice as the
    checkpoint stores it (e4m3 codes and the float32 scales of the blocks it touches, 128 x 128 in
    DeepSeek's; a head shard may start inside a block), used in the compute format, so a rank holds
    about the bytes it read. The absorbed form multiplies queries and latents by W_UK and W_UV head by head (batched
    matmuls, no FP8 kernel), so ``kv_b_dense`` keeps a compute-format copy of ``kv_b`` derived from
    the FP8 slice whenever the weights are made (load, ``shard``, ``from_shards``, a switch's gather,
    as SGLang derives its absorbed factors after load); :meth:`nbytes` counts it. The low-rank
    ``down`` (Q-A, KV-A, indexer keys) and the norms stay in the compute format."""

    heads: range
    total_heads: int
    q_a: torch.Tensor | None  # [r_q, d]; None when queries are projected directly
    q_a_norm: torch.Tensor | None  # [r_q]
    q_b: torch.Tensor | StackedFP8  # [h (d_n + d_r), r_q or d]
    kv_a: torch.Tensor  # [d_c + d_r, d]
    kv_a_norm: torch.Tensor  # [d_c]
    kv_b: torch.Tensor | StackedFP8  # [h (d_n + d_v), d_c]
    o: torch.Tensor | StackedFP8  # [d, h d_v]
    indexer_wk: torch.Tensor | None = None  # [indexer_dim, d]
    down: torch.Tensor | None = None  # q_a, kv_a, indexer_wk stacked by rows; they are views of it
    kv_b_dense: torch.Tensor | None = dataclasses.field(init=False, default=None, repr=False)  # kv_b kept FP8

    SHARDED = ("q_b", "kv_b", "o")
    SHARD_AXES = {"q_b": 0, "kv_b": 0, "o": 1}  # the axis a head-indexed tensor's shards join along

    def __post_init__(self):
        if isinstance(self.kv_b, StackedFP8):
            self.kv_b_dense = self.kv_b.dequantize()

    @property
    def kv_b_weight(self) -> torch.Tensor:
        """KV-B [h (d_n + d_v), d_c] in the compute format (W_UK and W_UV per head)."""
        return self.kv_b if self.kv_b_dense is None else self.kv_b_dense

    @classmethod
    def load(cls, source: WeightSource, profile: ModelProfile, layer: int, heads: range | None = None,
             device=None, dtype=None, fp8: bool = False) -> "MLAWeights":
        """Read layer ``layer``'s attention weights for ``heads`` (all heads by default); ``fp8``:
        Q-B, KV-B and O kept FP8 as the checkpoint stores them (ValueError or CheckpointError for a
        source or tensor that is not)."""
        m = profile.mla
        heads = range(m.heads) if heads is None else heads
        shapes = layer_tensor_shapes(profile, layer)
        a = f"{layer_prefix(layer)}.self_attn"
        qk, kvh = m.qk_nope_head_dim + m.qk_rope_head_dim, m.qk_nope_head_dim + m.v_head_dim
        kw = dict(device=device, dtype=dtype)

        def get(name, **cut):
            return source.get(f"{a}.{name}", shapes[f"{a}.{name}"], **cut, **kw)

        def projection(name, **cut):  # a head-indexed projection, kept FP8 or in the compute format
            if not fp8:
                return get(name, **cut)
            kept = _fp8_source(source).get_block_scaled(f"{a}.{name}", shapes[f"{a}.{name}"], **cut, device=device)
            return StackedFP8((kept,), dtype or torch.float32)

        q_b_name = "q_b_proj.weight" if m.q_lora_rank else "q_proj.weight"
        parts = (get("q_a_proj.weight") if m.q_lora_rank else None, get("kv_a_proj_with_mqa.weight"),
                 get("indexer.wk.weight") if profile.indexer is not None and profile.indexer.selects(layer) else None)
        down = torch.cat([p for p in parts if p is not None])
        q_a, kv_a, indexer_wk = _blocks(down, parts)
        return cls(
            heads=heads, total_heads=m.heads, q_a=q_a,
            q_a_norm=get("q_a_layernorm.weight") if m.q_lora_rank else None,
            q_b=projection(q_b_name, rows=slice(heads.start * qk, heads.stop * qk)),
            kv_a=kv_a, kv_a_norm=get("kv_a_layernorm.weight"),
            kv_b=projection("kv_b_proj.weight", rows=slice(heads.start * kvh, heads.stop * kvh)),
            o=projection("o_proj.weight", cols=slice(heads.start * m.v_head_dim, heads.stop * m.v_head_dim)),
            indexer_wk=indexer_wk, down=down,
        )

    @property
    def is_full(self) -> bool:
        return len(self.heads) == self.total_heads

    def shard(self, rank: int, T: int) -> "MLAWeights":
        """Rank ``rank``'s head shard cut out of these (full) weights: a switch into a sharded layout."""
        if not self.is_full:
            raise ValueError(f"cutting a shard needs full weights (these hold heads {self.heads})")
        heads = head_shard(self.total_heads, rank, T)
        h = len(self.heads)
        qk, kvh, dv = self.q_b.shape[0] // h, self.kv_b.shape[0] // h, self.o.shape[1] // h
        return dataclasses.replace(
            self, heads=heads,
            q_b=_cut(self.q_b, 0, heads.start * qk, len(heads) * qk),
            kv_b=_cut(self.kv_b, 0, heads.start * kvh, len(heads) * kvh),
            o=_cut(self.o, 1, heads.start * dv, len(heads) * dv),
        )

    @classmethod
    def from_shards(cls, shards: list["MLAWeights"]) -> "MLAWeights":
        """Full weights from all T head shards in rank order (after an all-gather into a replicated layout)."""
        heads = [h for s in shards for h in s.heads]
        if heads != list(range(shards[0].total_heads)):
            raise ValueError(f"shards cover heads {heads[:3]}..., not 0..{shards[0].total_heads - 1} in order")
        return dataclasses.replace(
            shards[0], heads=range(shards[0].total_heads),
            **{n: _join([getattr(s, n) for s in shards], cls.SHARD_AXES[n]) for n in cls.SHARDED},
        )

    def nbytes(self) -> dict[str, int]:
        """{'projections': Q-B + KV-B + O bytes held (kept FP8: as stored, plus KV-B's compute-format
        copy), 'replicated': the small always-whole rest}."""
        proj = sum(_size(getattr(self, n)) for n in (*self.SHARDED, "kv_b_dense"))
        rest = sum(_size(getattr(self, n)) for n in ("q_a", "q_a_norm", "kv_a", "kv_a_norm", "indexer_wk"))
        return {"projections": proj, "replicated": rest}


def projection_names(profile: ModelProfile, layers: int | None = None) -> list[str]:
    """The head-indexed projection weights (Q-B or Q, KV-B, O) of the MLA layers among the first
    ``layers`` layers: what ``attention_weights: fp8`` keeps as stored."""
    q_b = "q_b_proj" if profile.mla is not None and profile.mla.q_lora_rank else "q_proj"
    kinds = profile.layer_kinds[: profile.num_layers if layers is None else layers]
    return [f"{layer_prefix(i)}.self_attn.{n}.weight" for i, kind in enumerate(kinds) if kind is LayerKind.MLA
            for n in (q_b, "kv_b_proj", "o_proj")]


def _size(t: torch.Tensor | StackedFP8 | None) -> int:
    if isinstance(t, StackedFP8):
        return t.stored_bytes
    return 0 if t is None else t.numel() * t.element_size()


def _fp8_source(source: WeightSource):
    """``source`` if it hands out FP8 weights as stored; else ValueError (projections kept FP8 need one)."""
    if not callable(getattr(source, "get_block_scaled", None)):
        raise ValueError(f"attention weights kept FP8 need an FP8 block-scaled source; the weights come from "
                         f"{type(source).__name__}")
    return source


def _cut(t: torch.Tensor | StackedFP8, dim: int, begin: int, length: int) -> torch.Tensor | StackedFP8:
    """A copy of the run ``[begin, begin + length)`` along ``dim`` of a head-indexed projection (kept
    FP8: its codes, the scale blocks they touch and where it starts in its first block)."""
    if isinstance(t, StackedFP8):
        return StackedFP8((t.parts[0].narrow(dim, begin, length).clone(),), t.dtype)
    return t.narrow(dim, begin, length).clone()


def _join(parts: list, dim: int) -> torch.Tensor | StackedFP8:
    """Head shards of one projection joined along ``dim`` (kept FP8: with their scale grids merged)."""
    if isinstance(parts[0], StackedFP8):
        return StackedFP8((joined([p.parts[0] for p in parts], dim),), parts[0].dtype)
    return torch.cat(parts, dim=dim)


def _blocks(stacked: torch.Tensor, parts, dim: int = 0) -> list[torch.Tensor | None]:
    """Views of ``stacked`` along ``dim`` where each present part (stacked by rows) sits, in
    order; None stays None."""
    out, start = [], 0
    for p in parts:
        out.append(None if p is None else stacked.narrow(dim, start, p.shape[0]))
        start += 0 if p is None else p.shape[0]
    return out


class MLAMath:
    """The projections of one model's MLA layers (dims, eps and RoPE base from the profile), with
    the cache entries made by ``fused`` (:class:`~splash_core.platform.interfaces.FusedKernels`; None:
    the torch reference); queries come absorbed (:meth:`queries`) or per head for the expanded
    form (:meth:`head_queries`), results go out from the latent (:meth:`output`) or from values.
    Q-B and O kept FP8 go through ``fp8_kernels`` (:class:`~splash_core.platform.interfaces.FP8LinearKernels`,
    W8A8) or, without them, are dequantized at each use (the dequantize-at-load model's outputs)."""

    def __init__(self, profile: ModelProfile, fused=None, attention_form: str = "auto", fp8_kernels=None):
        """``attention_form``: how prefill rows attend (:data:`splash_core.profiles.deployment.FORMS`)."""
        if attention_form not in FORMS:
            raise ValueError(f"attention form must be one of {', '.join(FORMS)} (got {attention_form!r})")
        self.attention_form = attention_form
        self.dims = MLADims.of(profile.mla)
        m = profile.mla
        self.d_c, self.d_r, self.d_n, self.d_v = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
        self.eps, self.theta, self.rope_scaling = m.latent_norm_eps, profile.rope_theta, profile.rope_scaling
        self.rotates = profile.mla_rope
        self.scale = softmax_scale(profile)
        self.fused = fused or KERNELS
        self._rotate_into = self.fused.rotate or rotate  # the reference where the backend fuses none
        self.fp8_kernels = fp8_kernels

    @property
    def kv_width(self) -> int:
        return self.d_c + self.d_r

    def project(self, w: MLAWeights, x: torch.Tensor, kv_rows: slice | None = None):
        """Hidden rows ``x`` [n, d] through the down projections: (query input [n, r_q], Q-A's
        output normalised, or ``x`` itself without Q-LoRA; KV-A output; indexer keys or None).
        KV-A and the indexer see ``x[kv_rows]`` when given (DOP: queries for all rows, cache
        entries for the owner's), else all rows, and then one matmul does all three when
        ``w.down`` stacks them."""
        if w.down is not None and kv_rows is None:
            q_in, kv, keys = _blocks(x @ w.down.t(), (w.q_a, w.kv_a, w.indexer_wk), dim=1)
        else:
            xkv = x if kv_rows is None else x[kv_rows]
            q_in = None if w.q_a is None else x @ w.q_a.t()
            kv, keys = xkv @ w.kv_a.t(), None if w.indexer_wk is None else xkv @ w.indexer_wk.t()
        return (x if q_in is None else self.fused.add_rms_norm(q_in, None, w.q_a_norm, self.eps)[0]), kv, keys

    def queries(self, w: MLAWeights, q_in: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """Absorbed queries [n, h, d_c + d_r] of ``w``'s heads from the query input of :meth:`project`."""
        q = self._per_head(w, q_in)
        return self.absorb(w, q[..., : self.d_n], q[..., self.d_n:], rotary)

    def head_queries(self, w: MLAWeights, q_in: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """Per-head queries [n, h, d_n + d_r]: q_nope ++ rotated q_rope (the expanded form's)."""
        q = self._per_head(w, q_in)  # a fresh tensor: its rotary part is rotated in place, no concatenation
        self._rotate_into(q[..., self.d_n:], rotary.cos, rotary.sin, q[..., self.d_n:])
        return q

    def absorb(self, w: MLAWeights, q_nope: torch.Tensor, q_rope: torch.Tensor,
               rotary: Rotary | None = None) -> torch.Tensor:
        """Absorbed queries [n, h, d_c + d_r]: q_nope [n, h, d_n] · W_UK per head ++ q_rope, rotated
        by ``rotary`` where given (written straight into the result: no concatenation)."""
        n, heads = q_nope.shape[:2]
        out = q_nope.new_empty(n, heads, self.d_c + q_rope.shape[-1])
        # one batched matmul over heads, [h, n, d_n] x [h, d_n, d_c], into the latent channels
        torch.bmm(q_nope.transpose(0, 1), self._heads(w)[:, : self.d_n], out=out[..., : self.d_c].transpose(0, 1))
        if rotary is None:
            out[..., self.d_c:] = q_rope
        else:
            self._rotate_into(q_rope, rotary.cos, rotary.sin, out[..., self.d_c:])
        return out

    def _per_head(self, w: MLAWeights, q_in: torch.Tensor) -> torch.Tensor:
        return self._linear(q_in, w.q_b).view(q_in.shape[0], len(w.heads), self.d_n + self.d_r)

    def latent(self, w: MLAWeights, kv: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """Cache entries [n, d_c + d_r] from KV-A's output: normalised latent, then the rotated shared key."""
        return self.fused.latent(kv, w.kv_a_norm, rotary.cos, rotary.sin, self.eps)

    def write_latent(self, w: MLAWeights, kv: torch.Tensor, rotary: Rotary, cache: torch.Tensor,
                     slots: torch.Tensor) -> None:
        """:meth:`latent` of KV-A's output rows written into ``cache`` at flat ``slots`` (one fused
        kernel where the backend has it)."""
        self.fused.latent_write(kv, w.kv_a_norm, rotary.cos, rotary.sin, self.eps, cache, slots)

    def output(self, w: MLAWeights, latent_out: torch.Tensor) -> torch.Tensor:
        """O output [n, d] of ``w``'s heads for attention results [n, h, d_c] (partial if sharded)."""
        return self.project_values(w, self.values(w, latent_out))

    def values(self, w: MLAWeights, latent_out: torch.Tensor) -> torch.Tensor:
        """Attention results in the latent [n, h, d_c] through W_UV: values [n, h, d_v]."""
        w_uv = self._heads(w)[:, self.d_n:]  # [h, d_v, d_c]
        n, heads = latent_out.shape[:2]
        out = w_uv.new_empty(n, heads, self.d_v)  # row-major, so the O projection reads it with no copy
        torch.bmm(latent_out.to(w_uv.dtype).transpose(0, 1), w_uv.transpose(1, 2), out=out.transpose(0, 1))
        return out

    def project_values(self, w: MLAWeights, values: torch.Tensor) -> torch.Tensor:
        """O output [n, d] of per-head values [n, h, d_v]."""
        n, heads, d_v = values.shape
        return self._linear(values.reshape(n, heads * d_v).to(w.o.dtype), w.o)

    def _linear(self, x: torch.Tensor, w: torch.Tensor | StackedFP8) -> torch.Tensor:
        """``x W^T``; a weight kept FP8 through the FP8 kernels, else dequantized for this use only."""
        if not isinstance(w, StackedFP8):
            return x @ w.t()
        if self.fp8_kernels is not None:
            return self.fp8_kernels.linear(x, w.parts[0])
        return x @ w.dequantize().t()

    def _heads(self, w: MLAWeights) -> torch.Tensor:
        """KV-B per head [h, d_n + d_v, d_c]: W_UK then W_UV."""
        return w.kv_b_weight.view(len(w.heads), self.d_n + self.d_v, self.d_c)
