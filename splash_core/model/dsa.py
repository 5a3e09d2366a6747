"""DeepSeek Sparse Attention's math, layout-free: the lightning indexer, top-k, MLA over the selected keys.

For the rows ``x`` [n, d] of one request, with ``q_in`` the normalised Q-A output MLA's queries
start from (DeepSeek-V3.2; H indexer heads of width D, the first ``d_r`` channels rotary)::

    k_I   = RoPE(LayerNorm(x W_k))                 [n, D]      one indexer key per token, cached
    q_I   = RoPE(q_in W_qb)                        [n, H, D]
    w     = x W_w / sqrt(H)                        [n, H]      per-head weights
    I[s,t]= sum_h w[s,h] ReLU(q_I[s,h] . k_I[t] / sqrt(D))     over the keys t visible to query s
    S_s   = the top-k keys of I[s, :]  (all visible keys where fewer than k are visible)

and MLA attends from query s over the cached entries in ``S_s`` only. RoPE here rotates the
first ``d_r`` channels with the same angles and YaRN scale as MLA's rotary part, so the step's
:class:`~.rotary.Rotary` serves both: by halves (DeepSeek-V3.2), or by interleaved pairs (GLM-5,
``IndexerConfig.rope_interleave``), computed as the halves rotation of the channels reordered
evens-then-odds, which is also the order transformers leaves them in (scores only need q and k
in the same order).

Indices returned by :func:`select` point into whatever key axis the scores were computed over
(a request's dense history, a rank's slice of it): the caller maps them to cache rows. Scores
are float32 and computed in the order of the reference (scale, ReLU, then the weighted sum over
heads) so that the selection, a discontinuous function, matches it to the bit where it can.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..profiles.model import ModelProfile
from .rotary import Rotary
from .weights import WeightSource, indexer_tensor_shapes, layer_prefix

__all__ = ["IndexerWeights", "index_scores", "select", "sparse_attention", "visible"]

KEY_NORM_EPS = 1e-6  # the indexer key LayerNorm's epsilon (fixed in DeepSeek-V3.2, not in config.json)


@dataclasses.dataclass(frozen=True)
class IndexerWeights:
    """One layer's indexer weights (small; every rank keeps them whole in every layout)."""

    wq_b: torch.Tensor  # [H D, r_q]
    wk: torch.Tensor  # [D, d]
    k_norm: torch.Tensor  # [D] LayerNorm weight
    k_norm_bias: torch.Tensor  # [D]
    weights_proj: torch.Tensor  # [H, d]
    interleaved: bool = False  # RoPE rotates pairs (x0, x1), (x2, x3), ... (GLM-5), not halves

    @classmethod
    def load(cls, source: WeightSource, profile: ModelProfile, layer: int, device=None,
             dtype=None) -> "IndexerWeights":
        """Layer ``layer``'s indexer weights, whole."""
        attention = f"{layer_prefix(layer)}.self_attn"
        shapes = indexer_tensor_shapes(profile, attention)
        names = ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight")
        full = [f"{attention}.indexer.{name}" for name in names]
        return cls(*(source.get(name, shapes[name], device=device, dtype=dtype) for name in full),
                   interleaved=profile.indexer.rope_interleave)

    @property
    def heads(self) -> int:
        return self.weights_proj.shape[0]

    @property
    def head_dim(self) -> int:
        return self.wk.shape[0]

    def keys(self, x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """Indexer keys [n, D] of rows ``x``."""
        return self.finish_keys(x @ self.wk.t(), rotary)

    def finish_keys(self, projected: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """Indexer keys [n, D] from ``x W_k`` (computed elsewhere, e.g. by a stacked down projection)."""
        k = F.layer_norm(projected.float(), (self.head_dim,), self.k_norm.float(), self.k_norm_bias.float(),
                         KEY_NORM_EPS).to(projected.dtype)
        return self._rotate(k, rotary)

    def queries(self, q_in: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """Indexer queries [n, H, D] from MLA's normalised Q-A output ``q_in`` [n, r_q]."""
        return self._rotate((q_in @ self.wq_b.t()).view(q_in.shape[0], self.heads, self.head_dim), rotary)

    def _rotate(self, t: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """``t`` [n, ..., D] with its first d_r channels rotated in this indexer's convention."""
        d_r = rotary.cos.shape[-1]
        head = t[..., :d_r]
        if self.interleaved:
            head = torch.cat([head[..., 0::2], head[..., 1::2]], dim=-1)
        return torch.cat([rotary(head), t[..., d_r:]], dim=-1)

    def head_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Per-head weights [n, H] float32, with the 1/sqrt(H) folded in."""
        return (x @ self.weights_proj.t()).float() * self.heads ** -0.5


def visible(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """[n, T] bool: key t is visible to query s (causal: its position is not after the query's)."""
    return key_positions[None, :] <= query_positions[:, None]


def index_scores(queries: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                 seen: torch.Tensor) -> torch.Tensor:
    """Index scores [n, T] float32 of queries [n, H, D] (weights [n, H]) against keys [T, D];
    -inf where ``seen`` [n, T] is False."""
    scale = queries.shape[-1] ** -0.5
    per_head = F.relu(torch.matmul(queries.float(), keys.float().t()) * scale)  # [n, H, T]
    scores = torch.matmul(weights.unsqueeze(-2), per_head).squeeze(-2)  # [n, T]
    return scores.masked_fill(~seen, float("-inf"))


def select(scores: torch.Tensor, topk: int, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices [n, k] int64, valid [n, k] bool) of each row's top ``topk`` scores, k = min(topk, T);
    an index is valid where its score is finite (a query seeing fewer than k keys selects them all).

    Equal scores are ranked by position, earlier first (``positions`` [T] of the keys; None: the
    key axis is in position order), so that every layout selects the same keys even where a
    score ties at the k-th place (ReLU makes exact zeros common in small models)."""
    if scores.shape[-1] == 0:
        raise ValueError("top-k selection over no keys: a query must see at least itself")
    k = min(topk, scores.shape[-1])
    by_position = None if positions is None else positions.argsort(stable=True)
    ordered = scores if by_position is None else scores[:, by_position]
    top = torch.sort(ordered, dim=-1, descending=True, stable=True)
    indices = top.indices[:, :k]
    return (indices if by_position is None else by_position[indices]), torch.isfinite(top.values[:, :k])


def sparse_attention(queries: torch.Tensor, entries: torch.Tensor, indices: torch.Tensor, valid: torch.Tensor,
                     d_c: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA over the selected cache entries only: (latent results [n, h, d_c] float32,
    log-sum-exp [n, h] float32, for merging partial results across ranks).

    ``queries`` [n, h, d_c + d_r] (absorbed); ``entries`` [T, d_c + d_r]; ``indices``/``valid``
    [n, k] from :func:`select`. A row with no valid index has no result (zeros, lse -inf)."""
    picked = entries[indices].float()  # [n, k, d_c + d_r]
    logits = torch.einsum("nhe,nke->nhk", queries.float(), picked) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # [n, h]
    probs = torch.exp(logits - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return torch.einsum("nhk,nkc->nhc", probs, picked[..., :d_c]), lse

