"""A step's batch as arrays and every layout's per-rank loads (Table 2), vectorised: what the
scheduler's cost model (:mod:`splash_core.costmodel`) evaluates every step.

:func:`rank_loads` equals the request-by-request reference :func:`splash_core.loads.loads`
(tested) with a handful of O(B) numpy calls.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .layouts import LAYOUTS, Layout
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

    def of(self, layout: Layout) -> dict[str, np.ndarray]:
        i = LAYOUTS.index(layout)
        return {f.name: getattr(self, f.name)[i] for f in dataclasses.fields(self)}


def rank_loads(x: BatchArrays, T: int, page_size: int) -> RankLoads:
    """Every layout's per-rank loads, vectorised with a handful of O(B) bincounts (the
    scheduler's per-step path). Equal to :func:`splash_core.loads.loads` (tested)."""
    s, q, owners, P = x.contexts, x.query_rows, x.owners, page_size
    B = len(s)
    decode = x.decode
    if not decode:  # a request without rows this step holds its KV (Eq 6) but reads none
        s = np.where(q > 0, s, 0)
    pairs_i = s if decode else q * s - q * (q - 1) // 2
    pages_res = (x.reserved + (P - 1)) // P
    out = np.empty((6, len(LAYOUTS), T))
    proj, own, tokens, pairs, reserved, state = out
    n_rows = float(B if decode else q.sum())
    # request-owned layouts (DP, DOP) and what CP keeps on owners (KDA state)
    dp, dop, cp, tp = _I[Layout.DP], _I[Layout.DOP], _I[Layout.CP], _I[Layout.TP]
    held = np.bincount(owners, minlength=T)
    own[dp] = held if decode else np.bincount(owners, q, minlength=T)
    own[dop] = own[cp] = own[dp]
    tokens[dp] = np.bincount(owners, s, minlength=T)
    tokens[dop] = tokens[dp]
    pairs[dp] = pairs[dop] = tokens[dp] if decode else np.bincount(owners, pairs_i, minlength=T)
    reserved[dp] = np.bincount(owners, pages_res, minlength=T)
    reserved[dop] = reserved[dp]
    state[dp] = state[dop] = state[cp] = held
    # TP: every rank holds and reads everything, computes 1/T of the heads
    own[tp] = n_rows / T
    tokens[tp] = float(s.sum())
    pairs[tp] = float(pairs_i.sum()) / T
    reserved[tp] = float(pages_res.sum())
    state[tp] = B / T
    proj[:] = n_rows
    proj[dp] = own[dp]
    # CP: page p of request i lives on rank (p + i) mod T (ownership.cp_rank_of_page)
    if B:
        start = x.ids % T
        full, part = np.divmod(s, P)
        base, extra = np.divmod(full, T)
        rbase, rextra = np.divmod(pages_res, T)
        windows = _window_counts(start, (extra, rextra), T)
        tokens[cp] = P * float(base.sum()) + P * windows[0] + np.bincount((start + extra) % T, part, minlength=T)
        reserved[cp] = float(rbase.sum()) + windows[1]
        pairs[cp] = tokens[cp] if decode else _cp_pairs(s, q, x.ids, T, P)
    else:
        tokens[cp] = reserved[cp] = pairs[cp] = 0.0
    return RankLoads(proj, own, tokens, pairs, reserved, state)


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
    by the s − t rows at or after it (splash_core.loads._cp_tokens_and_pairs)."""
    f_s, g_s = cp_prefix_matrix(s, ids, T, P)
    f_c, g_c = cp_prefix_matrix(s, ids, T, P, upto=np.maximum(s - q, 0))
    return (q[:, None] * f_c + s[:, None] * (f_s - f_c) - (g_s - g_c)).sum(axis=0).astype(np.float64)

