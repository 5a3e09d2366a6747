"""Per-layer constants of the attention cost model (Eq 10): work and bytes of one layer of
each kind, computed once per deployment from the model's dims.

Projection work per row splits three ways, by where each weight lives:

- ``sharded``: the head-indexed projections Eq 9 counts (Q-B, KV-B, O; KDA's q/k/v/o and
  gates), on 1/T of the heads in TP and DOP, whole in DP and CP;
- ``query side``: Q-A, whose output every head shard needs, so TP and DOP run it on every
  row on every rank (replicated weights, replicated work);
- ``owner side``: KV-A and the sparse-attention indexer's projections (its key map, and with
  sparse attention its query and head-weight maps), which feed the cache: TP runs them on
  every row on every rank (it stores every history, and the indexer is not head-sharded),
  DOP, DP and CP only on the rows whose cache the rank writes.

Attention work per (query row, key) pair is absorbed MLA over all heads, 2·H·(d_q + d_z)
flops (d_q = d_c + d_r, d_z = d_c). With sparse attention (DeepSeek-V3.2's DSA) a row attends
to at most ``topk`` keys, but the indexer scores every visible key first (2·H_idx·d_idx flops
per pair); without it every visible key is attended. A layer that shares the previous layer's
selection (GLM-5's shared-indexer layers) runs no indexer: the indexer's projections, scores, key
reads and CP's candidate exchange are charged on the share of layers that select (``index_share``),
and the cached indexer keys on the share that store them (``stored_index_share``, in either mode).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import dtypes
from ..profiles.model import LayerKind, ModelProfile
from ..profiles.projections import projections


@dataclasses.dataclass(frozen=True)
class KindCosts:
    """Per-layer constants of one layer kind, computed once per deployment."""

    kind: LayerKind
    layers: int
    heads: int
    weight_bytes: float  # head-indexed projections of one layer (Eq 9's S_A)
    replicated_bytes: float  # query- and owner-side weights every rank holds
    flops_row_sharded: float  # head-indexed projections, all heads
    flops_row_query: float  # query side (Q-A)
    flops_row_owner: float  # owner side (KV-A, indexer projections)
    flops_pair: float  # MLA attention per (row, key), all heads
    flops_index_pair: float  # indexer score per (row, visible key); 0 without sparse attention
    flops_row_state: float  # KDA recurrent update per row, all heads
    kv_bytes_token: float  # MLA latent + rotary (+ scales) per token
    index_bytes_token: float  # indexer key (+ scale) per token
    state_bytes_request: float  # KDA recurrent state + conv caches per request
    width_to_owner: int  # DOP: elements per row and head sent to owners (d_q)
    width_from_owner: int  # DOP: elements per row and head returned (d_z)
    hidden_bytes_row: float  # activations of one row outside the heads (input, output)
    head_bytes_row: float  # activations of one row per head (query + attention output)
    topk: int | None  # keys each row attends to at most (None: dense attention)
    index_share: float = 1.0  # of these layers, the fraction that run their own indexer (the rest share its top-k)
    stored_index_share: float = 1.0  # of these layers, the fraction that store indexer keys (in either mode)

    @property
    def stored_bytes_token(self) -> float:
        """Cache bytes per token per layer (KV + indexer keys, a mean over the layers where only some
        store them): what Eq 1's k sums."""
        return self.kv_bytes_token + self.index_bytes_token * self.stored_index_share

    def scratch_bytes(self, rows, head_share) -> np.ndarray:
        """A of Eq 6: activations of ``rows`` rows, each on ``head_share`` of the heads."""
        return np.asarray(rows) * (self.hidden_bytes_row + head_share * self.heads * self.head_bytes_row)


def kind_costs(model: ModelProfile, kind: LayerKind, layers: int, act_bytes: int,
               sparse: bool, index_share: float = 1.0) -> KindCosts:
    """The constants of one layer of ``kind`` (per-layer means over its ``layers``); ``sparse``: top-k
    attention with the model's indexer, which ``index_share`` of the layers run themselves."""
    d, w_bytes = model.hidden_size, dtypes.nbytes(model.weight_dtype)
    params = sum(p.params for p in projections(model, kind))
    if kind is LayerKind.MLA:
        m, idx = model.mla, model.indexer
        query = d * m.q_lora_rank  # Q-A (0 without Q-LoRA: Q-B then reads the hidden state)
        owner = d * (m.kv_lora_rank + m.qk_rope_head_dim)  # KV-A
        index_pair, topk, index = 0.0, None, 0
        if idx is not None:
            index = d * idx.head_dim  # the indexer keys are cached in either case
            if sparse:  # its query (from the query latent) and per-head weights score every key
                index += (m.q_lora_rank or d) * idx.heads * idx.head_dim + d * idx.heads
                index_pair, topk = 2.0 * idx.heads * idx.head_dim * index_share, idx.topk
        owner += index * index_share  # dense too: only the layers with an indexer of their own project keys
        d_q, d_z = m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank  # absorbed MLA (Eq 4)
        return KindCosts(kind, layers, m.heads, params * w_bytes, (query + owner) * w_bytes, 2.0 * params,
                         2.0 * query, 2.0 * owner, 2.0 * m.heads * (d_q + d_z), index_pair, 0.0,
                         model.kv_bytes_per_token_layer, model.indexer_bytes_per_token_layer, 0.0,
                         d_q, d_z, act_bytes * 2 * d, act_bytes * (d_q + d_z), topk, index_share if sparse else 1.0,
                         index_share if idx is not None else 1.0)
    k = model.kda
    # the recurrent update touches each [K, V] state element about three times per row (decay,
    # the k·vᵀ write, the q·S read-out): 6 flops; q, k, v go to owners in DOP, outputs come back
    return KindCosts(kind, layers, k.heads, params * w_bytes, 0.0, 2.0 * params, 0.0, 0.0, 0.0, 0.0,
                     6.0 * k.heads * k.head_dim * k.head_dim, 0.0, 0.0, model.recurrent_bytes_per_request_layer,
                     3 * k.head_dim, k.head_dim, act_bytes * 2 * d, act_bytes * 4 * k.head_dim, None)


def sparse_pairs(contexts, query_rows, topk: int | None) -> np.ndarray:
    """(row, attended key) pairs per request when each row attends to at most ``topk`` of its
    visible keys: row j of the last ``q`` of ``s`` positions sees j + 1 keys (all of them
    without ``topk``: the causal pairs q·s − q(q−1)/2)."""
    s = np.asarray(contexts, dtype=np.int64)
    q = np.asarray(query_rows, dtype=np.int64)
    if topk is None:
        return q * s - q * (q - 1) // 2
    first = s - q + 1  # keys the first row sees
    top = np.minimum(s, topk)  # the last row that sees at most topk keys sees `top`
    below = np.where(first <= top, (first + top) * (top - first + 1) // 2, 0)
    above = (s - np.maximum(top, first - 1)) * topk
    return below + np.where(first <= top, above, q * topk)
