"""Per-rank loads of one step in one layout (paper Table 2, for arbitrary batches).

Table 2 counts, for B equal requests, how many histories each rank stores and reads and how
much attention it computes: TP B, B, B/T; CP B/T; DP and DOP ⌈B/T⌉. Here the same loads are
exact for any batch (unequal contexts, chunked prefill rows, idle ranks), per rank, in
tokens, bytes and query-key pairs; the cost model (Eq 10) turns them into time.

Conventions (per MLA layer unless a field says "all layers"):

- attention work counts causal (query row, visible key) pairs in units of all H heads: a TP
  rank computes H/T heads, so its pairs are scaled by 1/T; a CP rank computes the pairs whose
  key it holds; an owner computes its requests' pairs.
- KV read counts each held history token once per step (absorbed MLA reads the latent once
  for all local heads; TP therefore reads every history on every rank).
- projection rows are the query rows passing through the rank's projections: all N rows
  for TP and DOP (on 1/T of the heads), the owned rows for DP; CP computes a single query
  row (decode) on every rank, which attends to the keys it holds, and the rows of a prefill
  chunk on the ranks that hold their positions (each attends to the whole history).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from splash_core.layouts import Layout, Ownership, Placement
from splash_core.planning.ownership import Batch, check_batch, cp_prefix_matrix, footprint, layer_indices
from splash_core.profiles.model import LayerKind, ModelProfile


@dataclasses.dataclass(frozen=True)
class Loads:
    """Loads of every rank: each array field is [T]; :attr:`busiest` takes their maxima."""

    layout: Layout
    T: int
    head_fraction: float  # share of the heads a rank's projections cover: 1/T sharded, 1 replicated
    weight_bytes: np.ndarray  # W_ℓ: resident head-indexed projections, all covered layers
    kv_stored_tokens: np.ndarray  # history tokens held per MLA layer
    kv_stored_bytes: np.ndarray  # KV + indexer pages held, all covered layers (page-granular)
    kv_read_tokens: np.ndarray  # history tokens attention reads per MLA layer per step
    kv_read_bytes: np.ndarray  # KV + indexer bytes read per step, all covered MLA layers
    attention_pairs: np.ndarray  # causal (row, key) pairs per MLA layer, in all-head units
    query_rows: np.ndarray  # rows whose attention the rank computes
    projection_rows: np.ndarray  # rows through the rank's projections (on head_fraction of heads)
    recurrent_bytes: np.ndarray  # KDA state held, all covered layers

    ARRAYS = ("weight_bytes", "kv_stored_tokens", "kv_stored_bytes", "kv_read_tokens",
              "kv_read_bytes", "attention_pairs", "query_rows", "projection_rows", "recurrent_bytes")

    @property
    def busiest(self) -> dict[str, float]:
        """The busiest rank's value of every load (each may peak on a different rank)."""
        return {name: getattr(self, name).max().item() for name in self.ARRAYS}

    def busiest_rank(self, name: str) -> int:
        return int(np.argmax(getattr(self, name)))


def causal_pairs(contexts, query_rows) -> np.ndarray:
    """(row, visible key) pairs of requests whose last ``q`` of ``s`` positions are queries:
    row j attends to keys 0..j, so q·s − q(q−1)/2."""
    s = np.asarray(contexts, dtype=np.int64)
    q = np.asarray(query_rows, dtype=np.int64)
    return q * s - q * (q - 1) // 2


def loads(layout: Layout, batch: Batch, model: ModelProfile, T: int, page_size: int, *,
          layers: Iterable[int] | None = None) -> Loads:
    """Every rank's loads for one step of ``batch`` in ``layout`` (see the module docstring)."""
    check_batch(batch, T)
    fp = footprint(layout, batch, model, T, page_size, layers=layers)
    s, q, owners = batch.contexts, _rows(batch), batch.owners
    kinds = model.layer_kinds
    n_mla = sum(1 for i in layer_indices(model, layers) if kinds[i] is LayerKind.MLA)
    kv_bytes = model.kv_bytes_per_token_layer + model.indexer_bytes_per_token_layer
    pairs = causal_pairs(s, q)
    total_rows = int(q.sum())
    zeros = np.zeros(T, dtype=np.int64)
    proj_rows = zeros + total_rows
    if layout.ownership is Ownership.ALL:
        tokens = zeros + int(s.sum())
        att_pairs = np.full(T, pairs.sum() / T)
        att_rows = zeros + total_rows
    elif layout.ownership is Ownership.OWNER:
        tokens, att_rows, att_pairs = zeros.copy(), zeros.copy(), np.zeros(T)
        np.add.at(tokens, owners, s)
        np.add.at(att_rows, owners, q)
        np.add.at(att_pairs, owners, pairs)
    else:
        tokens, att_pairs, proj_rows = _cp_tokens_pairs_rows(batch, q, T, page_size)
        att_rows = zeros + total_rows
    if layout is Layout.DP:
        proj_rows = att_rows
    return Loads(
        layout=layout, T=T,
        head_fraction=1.0 / T if layout.placement is Placement.SHARDED else 1.0,
        weight_bytes=fp.weights,
        kv_stored_tokens=tokens,
        kv_stored_bytes=fp.kv + fp.indexer,
        kv_read_tokens=tokens,
        kv_read_bytes=tokens * kv_bytes * n_mla,
        attention_pairs=att_pairs,
        query_rows=att_rows,
        projection_rows=proj_rows,
        recurrent_bytes=fp.recurrent,
    )


def _rows(batch: Batch) -> np.ndarray:
    """Query rows per request, at most its context (the rows are its last positions)."""
    rows = np.fromiter((r.query_rows for r in batch.requests), dtype=np.int64, count=len(batch))
    return np.minimum(rows, batch.contexts)


def _cp_tokens_pairs_rows(batch: Batch, q: np.ndarray, T: int, page_size: int):
    """CP: tokens per rank, the causal pairs whose key each rank holds, and the query rows
    each rank projects (every single row; a chunk's rows where their positions live).

    A key at position t < s − q is seen by all q rows; one at t ≥ s − q by the s − t rows at
    or after it. With F, G the count and position sum of a rank's keys below a bound:
    pairs = q·F(s−q) + s·(F(s) − F(s−q)) − (G(s) − G(s−q)).
    """
    if not len(batch):
        return np.zeros(T, dtype=np.int64), np.zeros(T), np.zeros(T, dtype=np.int64)
    s, ids = batch.contexts, batch.ids
    c = np.maximum(s - q, 0)
    f_s, g_s = cp_prefix_matrix(s, ids, T, page_size)
    f_c, g_c = cp_prefix_matrix(s, ids, T, page_size, upto=c)
    pairs = q[:, None] * f_c + s[:, None] * (f_s - f_c) - (g_s - g_c)
    rows = (f_s - f_c)[q > 1].sum(axis=0) + int((q == 1).sum())
    return f_s.sum(axis=0), pairs.sum(axis=0).astype(np.float64), rows
