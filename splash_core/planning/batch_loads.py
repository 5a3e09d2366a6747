"""A step's batch as arrays and every layout's per-rank loads (Table 2), vectorised: what the
scheduler's cost model (:mod:`splash_core.planning.costmodel`) evaluates every step.

:func:`rank_loads` equals the request-by-request reference :func:`table2_loads.loads`
(tested) with a handful of O(B) numpy calls.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..layouts import LAYOUTS, Layout
from .layer_costs import sparse_pairs
from .ownership import Batch, Request, cp_prefix_matrix

_I = {layout: i for i, layout in enumerate(LAYOUTS)}  # row of each layout in the stacked arrays


@dataclasses.dataclass(frozen=True)
class BatchArrays:
    """A step's running requests as arrays: what the scheduler evaluates every step.

    ``reserved`` is the KV each request may reach (context plus the output it may still
    generate): Eq 6 checks it, so an admitted batch keeps fitting as it decodes. A request
    with 0 query rows (waiting for prefill budget) holds KV but costs no compute or reads."""

    contexts: np.ndarray  # s_i, including this step's query rows
    query_rows: np.ndarray  # q_i ≤ s_i: chunk rows in prefill, 1 in decode
    owners: np.ndarray
    ids: np.ndarray
    reserved: np.ndarray
    decode: bool = False  # every request has one query row (set by :meth:`of`)

    @classmethod
    def of(cls, contexts, owners, *, query_rows=None, ids=None, reserved=None) -> "BatchArrays":
        s = np.asarray(contexts, dtype=np.int64)
        q = np.ones_like(s) if query_rows is None else np.minimum(np.asarray(query_rows, dtype=np.int64), s)
        ids = np.arange(len(s), dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
        res = s if reserved is None else np.maximum(np.asarray(reserved, dtype=np.int64), s)
        return cls(s, q, np.asarray(owners, dtype=np.int64), ids, res, bool((q == 1).all()))

    @classmethod
    def from_batch(cls, batch: Batch, reserved=None) -> "BatchArrays":
        return cls.of(batch.contexts, batch.owners, ids=batch.ids, reserved=reserved,
                      query_rows=[r.query_rows for r in batch.requests])

    def to_batch(self) -> Batch:
        return Batch(tuple(Request(int(i), int(s), int(o), int(q)) for i, s, o, q in
                           zip(self.ids, self.contexts, self.owners, self.query_rows)))

    def history_batch(self) -> Batch:
        """Each request's history before this step (its context less the step's rows): what a
        switch taken in this step moves (the step's own rows are written in the destination)."""
        return Batch(tuple(Request(int(i), int(s - q), int(o), int(q)) for i, s, o, q in
                           zip(self.ids, self.contexts, self.owners, self.query_rows)))

    def __len__(self) -> int:
        return len(self.contexts)


@dataclasses.dataclass(frozen=True)
class RankLoads:
    """Per-rank loads of every layout for one step: each array is [len(LAYOUTS), T], row i
    for ``LAYOUTS[i]`` (Table 2's quantities per layer, exact for any batch)."""

    proj_rows: np.ndarray  # rows through the rank's projections (on 1/T of the heads if sharded)
    own_rows: np.ndarray  # rows of the requests the rank owns (TP: N/T, its head share)
    kv_tokens: np.ndarray  # history tokens held and read per MLA layer
    pairs: np.ndarray  # causal (row, key) pairs per MLA layer, all-head units (TP: 1/T of them)
    reserved_pages: np.ndarray  # pages Eq 6 reserves per MLA layer
    state_requests: np.ndarray  # requests' worth of KDA state held (TP: B/T)
    sparse_pairs: np.ndarray  # (row, attended key) pairs with top-k attention (= pairs without)
    remote_tokens: np.ndarray  # CP: history tokens of prefilling requests held elsewhere (0 otherwise)

    def of(self, layout: Layout) -> dict[str, np.ndarray]:
        i = LAYOUTS.index(layout)
        return {f.name: getattr(self, f.name)[i] for f in dataclasses.fields(self)}


def rank_loads(x: BatchArrays, T: int, page_size: int, topk: int | None = None) -> RankLoads:
    """Every layout's per-rank loads, vectorised with a handful of O(B) bincounts (the
    scheduler's per-step path). Equal to :func:`table2_loads.loads` (tested).

    CP computes a decode row (one query row) on every rank, each attending to the keys it
    holds, and a prefill chunk's rows on the ranks that hold their positions, each attending
    to the request's whole history (:attr:`RankLoads.remote_tokens` is what it lacks)."""
    s, q, owners, P = x.contexts, x.query_rows, x.owners, page_size
    B = len(s)
    decode = x.decode
    if not decode:  # a request without rows this step holds its KV (Eq 6) but reads none
        s = np.where(q > 0, s, 0)
    pairs_i = s if decode else q * s - q * (q - 1) // 2
    dense = topk is None or int(s.max(initial=0)) <= topk  # no row sees more than topk keys
    sparse_i = pairs_i if dense else sparse_pairs(s, q, topk)
    pages_res = (x.reserved + (P - 1)) // P
    out = np.zeros((8, len(LAYOUTS), T))
    proj, own, tokens, pairs, reserved, state, sparse, remote = out
    n_rows = float(B if decode else q.sum())
    # request-owned layouts (DP, DOP) and what CP keeps on owners (KDA state)
    dp, dop, cp, tp = _I[Layout.DP], _I[Layout.DOP], _I[Layout.CP], _I[Layout.TP]
    held = np.bincount(owners, minlength=T)
    own[dp] = held if decode else np.bincount(owners, q, minlength=T)
    own[dop] = own[cp] = own[dp]
    tokens[dp] = np.bincount(owners, s, minlength=T)
    tokens[dop] = tokens[dp]
    pairs[dp] = pairs[dop] = tokens[dp] if decode else np.bincount(owners, pairs_i, minlength=T)
    sparse[dp] = sparse[dop] = pairs[dp] if dense else np.bincount(owners, sparse_i, minlength=T)
    reserved[dp] = np.bincount(owners, pages_res, minlength=T)
    reserved[dop] = reserved[dp]
    state[dp] = state[dop] = state[cp] = held
    # TP: every rank holds and reads everything, computes 1/T of the heads
    own[tp] = n_rows / T
    tokens[tp] = float(s.sum())
    pairs[tp] = float(pairs_i.sum()) / T
    sparse[tp] = float(sparse_i.sum()) / T
    reserved[tp] = float(pages_res.sum())
    state[tp] = B / T
    proj[:] = n_rows
    proj[dp] = own[dp]
    if B:
        _cp_loads(out, x, s, q, None if dense else sparse_i, pages_res, T, P)
    return RankLoads(proj, own, tokens, pairs, reserved, state, sparse, remote)


def _cp_loads(out, x: BatchArrays, s, q, sparse_i, pages_res, T: int, P: int) -> None:
    """CP's row of every load; page p of request i lives on rank (p + i) mod T
    (ownership.cp_rank_of_page). ``sparse_i``: attended pairs per request (None: all visible)."""
    proj, own, tokens, pairs, reserved, state, sparse, remote = out[:, _I[Layout.CP]]
    start = x.ids % T
    full, part = np.divmod(s, P)
    base, extra = np.divmod(full, T)
    rbase, rextra = np.divmod(pages_res, T)
    windows = _window_counts(start, (extra, rextra), T)
    tokens[:] = P * float(base.sum()) + P * windows[0] + np.bincount((start + extra) % T, part, minlength=T)
    reserved[:] = float(rbase.sum()) + windows[1]
    chunked = q > 1
    proj[:] = int((q == 1).sum())  # a single query row is computed on every rank
    pairs[:] = tokens
    if not chunked.any() and sparse_i is None:  # decode, dense attention: pairs are the keys held
        sparse[:] = tokens
        return
    held, _ = cp_prefix_matrix(s, x.ids, T, P)  # [B, T] tokens of request i on rank r
    if chunked.any():
        below, _ = cp_prefix_matrix(s, x.ids, T, P, upto=np.maximum(s - q, 0))
        pairs[:] = _cp_pairs(s, q, x.ids, T, P)
        proj[:] += (held - below)[chunked].sum(axis=0)
        remote[:] = (s[chunked, None] - held[chunked]).sum(axis=0)
    # attended keys spread over the ranks as the request's history does
    sparse[:] = pairs if sparse_i is None else (sparse_i / np.maximum(s, 1)) @ held


def _window_counts(start: np.ndarray, lengths: tuple[np.ndarray, ...], T: int) -> list[np.ndarray]:
    """For each set of lengths (each < T) and rank r: how many requests' circular windows
    [start, start + length) mod T contain r. A histogram of (start, length) pairs times a
    constant T² x T incidence matrix: two numpy calls per set."""
    incidence = _incidence(T)
    key = start * T
    return [np.bincount(key + length, minlength=T * T) @ incidence for length in lengths]


@functools.lru_cache(maxsize=None)
def _incidence(T: int) -> np.ndarray:
    """[(start, length), rank] -> 1 if rank lies in the circular window [start, start + length)."""
    s, e, r = np.meshgrid(np.arange(T), np.arange(T), np.arange(T), indexing="ij")
    return (((r - s) % T) < e).reshape(T * T, T).astype(np.float64)


def _cp_pairs(s, q, ids, T: int, P: int) -> np.ndarray:
    """CP pairs per rank in prefill: keys below s − q are seen by all q rows, a key at t ≥ s − q
    by the s − t rows at or after it (table2_loads._cp_tokens_and_pairs)."""
    f_s, g_s = cp_prefix_matrix(s, ids, T, P)
    f_c, g_c = cp_prefix_matrix(s, ids, T, P, upto=np.maximum(s - q, 0))
    return (q[:, None] * f_c + s[:, None] * (f_s - f_c) - (g_s - g_c)).sum(axis=0).astype(np.float64)

