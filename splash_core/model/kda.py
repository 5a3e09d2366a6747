"""The KDA block's math, layout-free: Kimi-Linear's Kimi delta attention (``KimiDeltaAttention``).

For hidden rows ``x`` of one request (H heads, K = V = head_dim, conv width c)::

    q, k, v = SiLU(causal depthwise conv_c(x W_q)), ... of k, v   short conv over the last c inputs
    q, k    = q / sqrt(|q|² + 1e-6), ... per head                (fla's use_qk_l2norm_in_kernel)
    g       = -exp(A_log_h) softplus(x W_fa W_fb + dt_bias)     [H, K] per-channel log decay
    beta    = sigmoid(x W_b)                                     [H]
    o       = gated delta rule over (q, k, v, g, beta) from the request's state, scale 1/sqrt(K)
    out     = (RMSNorm_V(o) w_norm * sigmoid(x W_ga W_gb)) W_o   (FusedRMSNormGated, sigmoid)

This module holds the row-wise parts (projections, gates, output); the per-request parts (the
convolution over cached inputs and the recurrence) are :mod:`~splash_core.runtime.kda_recurrence`.
Every function works on any subset of heads: given a head shard's weights it computes that
shard's inputs and gates, and that shard's partial output (to be summed over shards).

Per-head activations are laid out head-major: pre-convolution inputs ``[n, h, 3, K]`` (q, k, v
of each head side by side), so a head shard of them, of the conv taps and of the conv cache is
one contiguous slice.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..profiles.model import ModelProfile
from .ops import rms_norm
from .weights import WeightSource, head_shard, kda_tensor_shapes, layer_prefix

QK_NORM_EPS = 1e-6  # fla's l2norm epsilon


@dataclasses.dataclass
class KDAWeights:
    """Attention weights of one KDA layer on one rank: all heads (replicated) or a head shard.

    The head-indexed tensors (``SHARDED``, what :mod:`splash_core.planning.weight_bytes` counts for Eq 9) hold
    only the heads in ``heads``; ``o`` is split by columns, the others by rows. The low-rank gate
    down-projections, the output norm and the conv taps are small and whole on every rank in
    every layout (the taps because DOP's owner convolves all heads of its rows)."""

    heads: range
    total_heads: int
    q: torch.Tensor  # [h K, d]
    k: torch.Tensor  # [h K, d]
    v: torch.Tensor  # [h V, d]
    f_b: torch.Tensor  # [h K, K]
    dt_bias: torch.Tensor  # [h K]
    a_log: torch.Tensor  # [h]
    b: torch.Tensor  # [h, d]
    g_b: torch.Tensor  # [h V, V]
    o: torch.Tensor  # [d, h V]
    conv: torch.Tensor  # [H, 3, K, c]: q/k/v taps of every head
    f_a: torch.Tensor  # [K, d]
    g_a: torch.Tensor  # [V, d]
    o_norm: torch.Tensor  # [V]

    SHARDED = ("q", "k", "v", "f_b", "dt_bias", "a_log", "b", "g_b", "o")
    SHARD_AXES = {**dict.fromkeys(SHARDED, 0), "o": 1}  # the axis a head-indexed tensor's shards join along
    REPLICATED = ("conv", "f_a", "g_a", "o_norm")

    @classmethod
    def load(cls, source: WeightSource, profile: ModelProfile, layer: int, heads: range | None = None,
             device=None, dtype=None) -> "KDAWeights":
        """Read layer ``layer``'s KDA weights for ``heads`` (all heads by default)."""
        H, K = profile.kda.heads, profile.kda.head_dim
        heads = range(H) if heads is None else heads
        shapes = kda_tensor_shapes(profile, layer)
        a = f"{layer_prefix(layer)}.self_attn"
        kw = dict(device=device, dtype=dtype)
        rows = slice(heads.start * K, heads.stop * K)

        def get(name, **cut):
            return source.get(f"{a}.{name}", shapes[f"{a}.{name}"], **cut, **kw)

        conv = torch.stack([get(f"{n}_conv1d.weight").view(H, K, -1) for n in ("q", "k", "v")], dim=1)
        return cls(
            heads=heads, total_heads=H,
            q=get("q_proj.weight", rows=rows), k=get("k_proj.weight", rows=rows), v=get("v_proj.weight", rows=rows),
            f_b=get("f_b_proj.weight", rows=rows), dt_bias=get("dt_bias", rows=rows),
            a_log=get("A_log").reshape(H)[heads.start: heads.stop].contiguous(),  # stored [1, 1, H, 1]
            b=get("b_proj.weight", rows=slice(heads.start, heads.stop)),
            g_b=get("g_b_proj.weight", rows=rows), o=get("o_proj.weight", cols=rows),
            conv=conv.contiguous(), f_a=get("f_a_proj.weight"), g_a=get("g_a_proj.weight"),
            o_norm=get("o_norm.weight"),
        )

    @property
    def is_full(self) -> bool:
        return len(self.heads) == self.total_heads

    def _cut(self, name: str, heads: range) -> torch.Tensor:
        t = getattr(self, name)
        axis = self.SHARD_AXES[name]
        per = t.shape[axis] // len(self.heads)
        lo = (heads.start - self.heads.start) * per
        return t.narrow(axis, lo, len(heads) * per).clone()

    def shard(self, rank: int, T: int) -> "KDAWeights":
        """Rank ``rank``'s head shard cut out of these (full) weights: a switch into a sharded layout."""
        if not self.is_full:
            raise ValueError(f"cutting a shard needs full weights (these hold heads {self.heads})")
        heads = head_shard(self.total_heads, rank, T)
        return dataclasses.replace(self, heads=heads, **{n: self._cut(n, heads) for n in self.SHARDED})

    @classmethod
    def from_shards(cls, shards: list["KDAWeights"]) -> "KDAWeights":
        """Full weights from all T head shards in rank order (after an all-gather into a replicated layout)."""
        heads = [h for s in shards for h in s.heads]
        if heads != list(range(shards[0].total_heads)):
            raise ValueError(f"shards cover heads {heads[:3]}..., not 0..{shards[0].total_heads - 1} in order")
        joined = {n: torch.cat([getattr(s, n) for s in shards], dim=cls.SHARD_AXES[n]) for n in cls.SHARDED}
        return dataclasses.replace(shards[0], heads=range(shards[0].total_heads), **joined)

    def nbytes(self) -> dict[str, int]:
        """{'projections': head-indexed tensors held, 'replicated': the small always-whole rest}."""
        size = lambda n: getattr(self, n).numel() * getattr(self, n).element_size()  # noqa: E731
        return {"projections": sum(map(size, self.SHARDED)), "replicated": sum(map(size, self.REPLICATED))}


class KDAMath:
    """The row-wise projections of one model's KDA layers (dims and eps from the profile)."""

    def __init__(self, profile: ModelProfile):
        k = profile.kda
        self.heads, self.head_dim, self.conv_size = k.heads, k.head_dim, k.conv_size
        self.eps = profile.rms_norm_eps
        self.scale = k.head_dim ** -0.5

    def inputs(self, w: KDAWeights, x: torch.Tensor) -> torch.Tensor:
        """Pre-convolution q/k/v [n, h, 3, K] of ``w``'s heads for hidden rows ``x`` [n, d]."""
        n, h, K = x.shape[0], len(w.heads), self.head_dim
        return torch.stack([(x @ p.t()).view(n, h, K) for p in (w.q, w.k, w.v)], dim=2)

    def decay(self, w: KDAWeights, x: torch.Tensor) -> torch.Tensor:
        """Per-channel log decay g [n, h, K] float32 (<= 0): Kimi's fused_kda_gate."""
        h = len(w.heads)
        f = ((x @ w.f_a.t()) @ w.f_b.t()).float().view(x.shape[0], h, self.head_dim)
        return -w.a_log.float().exp()[:, None] * F.softplus(f + w.dt_bias.float().view(h, self.head_dim))

    @staticmethod
    def beta(w: KDAWeights, x: torch.Tensor) -> torch.Tensor:
        """Delta-rule write strength beta [n, h] float32 in (0, 1)."""
        return torch.sigmoid((x @ w.b.t()).float())

    @staticmethod
    def activate(conv_out: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Convolution outputs [n, h, 3, K] (float32) -> SiLU, L2-normalised q and k, v, in ``dtype``."""
        a = F.silu(conv_out)
        q, k, v = a.unbind(dim=2)
        norm = lambda t: t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) + QK_NORM_EPS)  # noqa: E731
        return norm(q).to(dtype), norm(k).to(dtype), v.to(dtype)

    def output(self, w: KDAWeights, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """O output [n, d] of ``w``'s heads for recurrence outputs ``o`` [n, h, V] of rows ``x``
        (partial if sharded): gated RMSNorm per head, then o_proj."""
        n, h = x.shape[0], len(w.heads)
        gate = ((x @ w.g_a.t()) @ w.g_b.t()).float().view(n, h, self.head_dim)
        normed = rms_norm(o.float(), w.o_norm, self.eps).float() * torch.sigmoid(gate)
        return normed.to(x.dtype).reshape(n, h * self.head_dim) @ w.o.t()
