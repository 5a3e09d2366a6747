"""The MLA block's math, layout-free: RMSNorm, RoPE, Q-A/Q-B, KV-A, absorbed queries, W_UV and O.

Absorbed MLA (DeepSeek-V2 §2.1.2): the per-head key up-projection W_UK is folded into the
query, ``q_lat = q_nope · W_UK`` [n, h, d_c], so attention scores are ``q_lat · c + q_rope · k_rope``
against the cached latent ``c`` and shared rotary key ``k_rope``; attention returns a
softmax-weighted latent [n, h, d_c] and the value up-projection W_UV plus O turn it into the
hidden width. Every function works on any subset of heads: given a head shard's weights it
computes that shard's queries and that shard's partial O output (to be summed over shards).

RoPE rotates the first and second halves of the rotary channels (the Hugging Face
``rotate_half`` convention), with base ``rope_theta``; softmax scale ``1/sqrt(d_n + d_r)``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..profiles.model import ModelProfile
from .weights import WeightSource, head_shard, layer_prefix, tensor_shapes


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x`` [n, ..., d_r] by ``positions`` [n] (rotate-half convention)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.float()[:, None] * inv_freq[None, :]  # [n, d/2]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    cos, sin = angles.cos().view(shape), angles.sin().view(shape)
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@dataclasses.dataclass
class MLAWeights:
    """Attention weights of one MLA layer on one rank: all heads (replicated) or a head shard.

    ``q_b``, ``kv_b`` and ``o`` (the projections sharded layouts split, W_A of paper Eq 1) hold
    only the heads in ``heads``; ``q_a``, ``kv_a``, the norms and the indexer key projection are
    small and every rank keeps them whole in every layout."""

    heads: range
    total_heads: int
    q_a: torch.Tensor | None  # [r_q, d]; None when queries are projected directly
    q_a_norm: torch.Tensor | None  # [r_q]
    q_b: torch.Tensor  # [h (d_n + d_r), r_q or d]
    kv_a: torch.Tensor  # [d_c + d_r, d]
    kv_a_norm: torch.Tensor  # [d_c]
    kv_b: torch.Tensor  # [h (d_n + d_v), d_c]
    o: torch.Tensor  # [d, h d_v]
    indexer_wk: torch.Tensor | None = None  # [indexer_dim, d]

    SHARDED = ("q_b", "kv_b", "o")

    @classmethod
    def load(cls, source: WeightSource, profile: ModelProfile, layer: int, heads: range | None = None,
             device=None, dtype=None) -> "MLAWeights":
        """Read layer ``layer``'s attention weights for ``heads`` (all heads by default)."""
        m = profile.mla
        heads = range(m.heads) if heads is None else heads
        shapes = tensor_shapes(profile, layer + 1)
        a = f"{layer_prefix(layer)}.self_attn"
        qk, kvh = m.qk_nope_head_dim + m.qk_rope_head_dim, m.qk_nope_head_dim + m.v_head_dim
        kw = dict(device=device, dtype=dtype)

        def get(name, **cut):
            return source.get(f"{a}.{name}", shapes[f"{a}.{name}"], **cut, **kw)

        q_b_name = "q_b_proj.weight" if m.q_lora_rank else "q_proj.weight"
        return cls(
            heads=heads, total_heads=m.heads,
            q_a=get("q_a_proj.weight") if m.q_lora_rank else None,
            q_a_norm=get("q_a_layernorm.weight") if m.q_lora_rank else None,
            q_b=get(q_b_name, rows=slice(heads.start * qk, heads.stop * qk)),
            kv_a=get("kv_a_proj_with_mqa.weight"),
            kv_a_norm=get("kv_a_layernorm.weight"),
            kv_b=get("kv_b_proj.weight", rows=slice(heads.start * kvh, heads.stop * kvh)),
            o=get("o_proj.weight", cols=slice(heads.start * m.v_head_dim, heads.stop * m.v_head_dim)),
            indexer_wk=get("indexer.wk.weight") if profile.indexer is not None else None,
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
            q_b=self.q_b[heads.start * qk: heads.stop * qk].clone(),
            kv_b=self.kv_b[heads.start * kvh: heads.stop * kvh].clone(),
            o=self.o[:, heads.start * dv: heads.stop * dv].clone(),
        )

    @classmethod
    def from_shards(cls, shards: list["MLAWeights"]) -> "MLAWeights":
        """Full weights from all T head shards in rank order (after an all-gather into a replicated layout)."""
        heads = [h for s in shards for h in s.heads]
        if heads != list(range(shards[0].total_heads)):
            raise ValueError(f"shards cover heads {heads[:3]}..., not 0..{shards[0].total_heads - 1} in order")
        return dataclasses.replace(
            shards[0], heads=range(shards[0].total_heads),
            q_b=torch.cat([s.q_b for s in shards]), kv_b=torch.cat([s.kv_b for s in shards]),
            o=torch.cat([s.o for s in shards], dim=1),
        )

    def nbytes(self) -> dict[str, int]:
        """{'projections': Q-B + KV-B + O bytes held, 'replicated': the small always-whole rest}."""
        size = lambda t: 0 if t is None else t.numel() * t.element_size()  # noqa: E731
        proj = sum(size(getattr(self, n)) for n in self.SHARDED)
        rest = sum(size(getattr(self, n)) for n in ("q_a", "q_a_norm", "kv_a", "kv_a_norm", "indexer_wk"))
        return {"projections": proj, "replicated": rest}


class MLAMath:
    """The projections of one model's MLA layers (dims, eps and RoPE base from the profile)."""

    def __init__(self, profile: ModelProfile):
        m = profile.mla
        self.d_c, self.d_r, self.d_n, self.d_v = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
        self.eps, self.theta = profile.rms_norm_eps, profile.rope_theta
        self.scale = 1.0 / math.sqrt(self.d_n + self.d_r)

    @property
    def kv_width(self) -> int:
        return self.d_c + self.d_r

    def queries(self, w: MLAWeights, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Absorbed queries [n, h, d_c + d_r] of ``w``'s heads for hidden rows ``x`` [n, d]."""
        if w.q_a is not None:
            x = rms_norm(x @ w.q_a.t(), w.q_a_norm, self.eps)
        h = len(w.heads)
        q = (x @ w.q_b.t()).view(x.shape[0], h, self.d_n + self.d_r)
        w_uk = w.kv_b.view(h, self.d_n + self.d_v, self.d_c)[:, : self.d_n]  # [h, d_n, d_c]
        q_lat = torch.einsum("nhd,hdc->nhc", q[..., : self.d_n], w_uk)
        q_rope = rope(q[..., self.d_n:], positions, self.theta)
        return torch.cat([q_lat, q_rope], dim=-1)

    def latent(self, w: MLAWeights, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache entries [n, d_c + d_r]: normalised latent, then the rotated shared key."""
        kv = x @ w.kv_a.t()
        c = rms_norm(kv[:, : self.d_c], w.kv_a_norm, self.eps)
        return torch.cat([c, rope(kv[:, self.d_c:], positions, self.theta)], dim=-1)

    @staticmethod
    def indexer_keys(w: MLAWeights, x: torch.Tensor) -> torch.Tensor | None:
        """Indexer keys [n, indexer_dim] (stored beside the KV; attention stays dense)."""
        return None if w.indexer_wk is None else x @ w.indexer_wk.t()

    def output(self, w: MLAWeights, latent_out: torch.Tensor) -> torch.Tensor:
        """O output [n, d] of ``w``'s heads for attention results [n, h, d_c] (partial if sharded)."""
        h = len(w.heads)
        w_uv = w.kv_b.view(h, self.d_n + self.d_v, self.d_c)[:, self.d_n:]  # [h, d_v, d_c]
        v = torch.einsum("nhc,hvc->nhv", latent_out.to(w_uv.dtype), w_uv)
        return v.reshape(v.shape[0], h * self.d_v) @ w.o.t()
