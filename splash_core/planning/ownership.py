"""The ownership model (paper §2, Eq 1, Table 2): who holds what in each layout.

Placement rules every part of SPLASH shares (planner, runtime, cost model):

- weights: sharded layouts give rank r head shard r of every projection; replicated layouts
  give every rank all T shards.
- kv / indexer (per token, in pages of ``page_size``): TP puts every page on every rank;
  DP and DOP put a request's pages on its owner; CP puts page p of request i on rank
  ``(p + i) mod T`` (:func:`cp_rank_of_page`), which balances stored tokens to within a page.
- recurrent (per request, KDA): TP splits it by head shard like the projections; DP, DOP and
  CP keep the whole state on the request's owner (CP has no position axis to split it by). A
  request holds it once it has a history (context > 0), like its first page.

Owners are chosen at admission for every request, whatever the layout, so a later switch into
DP or DOP knows where each history goes.

Footprints (:func:`footprint`) follow these rules page by page, so a runtime pool of the same
page size allocates exactly what they predict; :func:`eq1_footprint` and
:func:`eq1_longest_context` are Eq 1 and §2's closed forms for balanced batches, and
:func:`longest_balanced_context` their page-granular counterpart. Per-step loads (Table 2)
live in :mod:`table2_loads`, block sets in :mod:`blocks`, switch plans in
:mod:`splash_core.planning.manifest`.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

from ..layouts import Layout, Ownership, Placement
from ..profiles.model import LayerKind, ModelProfile
from ..profiles.projections import check_divides, projections


@dataclasses.dataclass(frozen=True)
class Request:
    """A running request as the ownership model sees it."""

    id: int  # stable, unique within the group
    context: int  # s_i: tokens in its history, including this step's query rows
    owner: int  # owner rank (DP/DOP history, CP/DP/DOP recurrent state)
    query_rows: int = 1  # q_i: chunk length in prefill, 1 in decode


@dataclasses.dataclass(frozen=True)
class Batch:
    """The running requests of one step."""

    requests: tuple[Request, ...]

    @classmethod
    def balanced(cls, batch: int, context: int, T: int, query_rows: int = 1) -> "Batch":
        """``batch`` requests of equal context with round-robin owners (the paper's B, s)."""
        return cls(tuple(Request(i, context, i % T, query_rows) for i in range(batch)))

    @property
    def contexts(self) -> np.ndarray:
        return np.fromiter((r.context for r in self.requests), dtype=np.int64, count=len(self.requests))

    @property
    def owners(self) -> np.ndarray:
        return np.fromiter((r.owner for r in self.requests), dtype=np.int64, count=len(self.requests))

    @property
    def ids(self) -> np.ndarray:
        return np.fromiter((r.id for r in self.requests), dtype=np.int64, count=len(self.requests))

    def __len__(self) -> int:
        return len(self.requests)


# ---- placement rules ------------------------------------------------------------------

def cp_rank_of_page(request_id, page, T: int):
    """Rank that holds page ``page`` of request ``request_id`` under CP (works on arrays)."""
    return (page + request_id) % T


def pages_for(tokens, page_size: int):
    """Pages needed for ``tokens`` tokens (works on arrays)."""
    return -(-np.asarray(tokens) // page_size)


def cp_tokens_per_rank(context: int, request_id: int, T: int, page_size: int) -> np.ndarray:
    """Tokens of one request held by each rank under CP."""
    counts = np.zeros(T, dtype=np.int64)
    full, rest = divmod(int(context), page_size)
    if full:
        # full pages p = 0..full-1 land on (p + id) mod T: full // T each, one more for some
        base, extra = divmod(full, T)
        counts += base * page_size
        start = request_id % T
        for j in range(extra):
            counts[(start + j) % T] += page_size
    if rest:
        counts[cp_rank_of_page(request_id, full, T)] += rest
    return counts


def cp_pages_per_rank(context: int, request_id: int, T: int, page_size: int) -> np.ndarray:
    """Pages of one request held by each rank under CP."""
    n = int(pages_for(context, page_size))
    base, extra = divmod(n, T)
    counts = np.full(T, base, dtype=np.int64)
    start = request_id % T
    for j in range(extra):
        counts[(start + j) % T] += 1
    return counts


def assign_owner(projected_tokens_per_rank: Sequence[int]) -> int:
    """Owner for a new request: the rank with the least projected KV.

    ``projected_tokens_per_rank[r]`` counts, for requests already owned by r, their context
    plus the tokens they may still generate; ties go to the lowest rank.
    """
    return int(np.argmin(np.asarray(projected_tokens_per_rank, dtype=np.int64)))


def assign_owners(projected_tokens: Iterable[int], T: int,
                  initial: Sequence[int] | None = None) -> list[int]:
    """Owners for requests admitted together, in order, each by :func:`assign_owner`."""
    loads = np.zeros(T, dtype=np.int64) if initial is None else np.asarray(initial, dtype=np.int64).copy()
    owners = []
    for tokens in projected_tokens:
        r = assign_owner(loads)
        owners.append(r)
        loads[r] += int(tokens)
    return owners


# ---- per-rank tokens and pages ----------------------------------------------------------

def cp_prefix_matrix(contexts, ids, T: int, page_size: int, upto=None) -> tuple[np.ndarray, np.ndarray]:
    """Under CP, for every request i and rank r: how many of the request's positions below
    ``upto[i]`` (default: its context) rank r holds, and the sum of those positions.

    Closed form over the page rotation of :func:`cp_rank_of_page`; both results are int64
    arrays [len(contexts), T]. Rank r holds the pages p ≡ (r − id) mod T.
    """
    ids = np.asarray(ids, dtype=np.int64)
    x = np.asarray(contexts if upto is None else upto, dtype=np.int64)
    P = int(page_size)
    k = (np.arange(T, dtype=np.int64)[None, :] - ids[:, None]) % T  # residue of rank r's pages
    full, part = np.divmod(x, P)
    m = (full[:, None] - k + T - 1) // T  # full pages p < full with p ≡ k (mod T)
    count = m * P
    page_sum = m * k + T * m * (m - 1) // 2  # sum of those page numbers
    possum = P * P * page_sum + m * (P * (P - 1) // 2)
    tail = (full % T)[:, None] == k  # the partial page below x lands on this rank
    count = count + np.where(tail, part[:, None], 0)
    possum = possum + np.where(tail, (part * full * P + part * (part - 1) // 2)[:, None], 0)
    return count, possum


def cp_pages_matrix(contexts, ids, T: int, page_size: int) -> np.ndarray:
    """Pages of request i held by rank r under CP, as an int64 array [len(contexts), T]."""
    ids = np.asarray(ids, dtype=np.int64)
    base, extra = np.divmod(pages_for(np.asarray(contexts, dtype=np.int64), page_size), T)
    k = (np.arange(T, dtype=np.int64)[None, :] - ids[:, None]) % T
    return base[:, None] + (k < extra[:, None])


def kv_tokens_per_rank(layout: Layout, batch: Batch, T: int, page_size: int) -> np.ndarray:
    """Tokens of history each rank stores in one cache-bearing layer."""
    out = np.zeros(T, dtype=np.int64)
    if layout.ownership is Ownership.ALL:
        out += int(batch.contexts.sum())
    elif layout.ownership is Ownership.OWNER:
        np.add.at(out, batch.owners, batch.contexts)
    elif len(batch):
        out += cp_prefix_matrix(batch.contexts, batch.ids, T, page_size)[0].sum(axis=0)
    return out


def kv_pages_per_rank(layout: Layout, batch: Batch, T: int, page_size: int) -> np.ndarray:
    """Pages each rank holds in one cache-bearing layer (what its pool allocates)."""
    out = np.zeros(T, dtype=np.int64)
    pages = pages_for(batch.contexts, page_size)
    if layout.ownership is Ownership.ALL:
        out += int(pages.sum())
    elif layout.ownership is Ownership.OWNER:
        np.add.at(out, batch.owners, pages)
    elif len(batch):
        out += cp_pages_matrix(batch.contexts, batch.ids, T, page_size).sum(axis=0)
    return out


# ---- footprints (Eq 1, page-granular) --------------------------------------------------

def layer_indices(model: ModelProfile, layers: Iterable[int] | None = None) -> tuple[int, ...]:
    """The layers a footprint or plan covers: all of the model's, or ``layers`` (validated)."""
    if layers is None:
        return tuple(range(model.num_layers))
    out = tuple(sorted(set(int(i) for i in layers)))
    bad = [i for i in out if not 0 <= i < model.num_layers]
    if bad:
        raise ValueError(f"layer {bad[0]} is outside the model's layers 0..{model.num_layers - 1}")
    return out


def check_batch(batch: Batch, T: int) -> None:
    """ValueError unless every owner is a rank of the group and request ids are unique."""
    owners, ids = batch.owners, batch.ids
    if len(owners) and (owners.min() < 0 or owners.max() >= T):
        bad = int(owners[(owners < 0) | (owners >= T)][0])
        raise ValueError(f"owner {bad} is not a rank of a group of T = {T}")
    if len(np.unique(ids)) != len(ids):
        raise ValueError("request ids must be unique within the group")
    if len(batch) and batch.contexts.min() < 0:
        raise ValueError("contexts must be >= 0")


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Bytes of attention state each rank holds in one layout: int64 arrays [T].

    KV and indexer are page-granular, so a runtime pool of the same page size allocates
    exactly ``pages × page_size × bytes per token per layer × cache-bearing layers``.
    """

    layout: Layout
    weights: np.ndarray  # head-indexed projections of the covered layers
    kv: np.ndarray  # MLA latent + rotary pages
    indexer: np.ndarray  # sparse-attention indexer pages
    recurrent: np.ndarray  # KDA state + short-conv caches

    @property
    def total(self) -> np.ndarray:
        return self.weights + self.kv + self.indexer + self.recurrent

    @property
    def busiest(self) -> int:
        """M of the busiest rank, what a per-rank budget must hold."""
        return int(self.total.max()) if len(self.total) else 0


def _owner_pages(layout: Layout, contexts, ids, owners, T: int, page_size: int) -> np.ndarray:
    out = np.zeros(T, dtype=np.int64)
    pages = pages_for(np.asarray(contexts, dtype=np.int64), page_size)
    if layout.ownership is Ownership.ALL:
        out += int(pages.sum())
    elif layout.ownership is Ownership.OWNER:
        np.add.at(out, owners, pages)
    elif len(pages):
        out += cp_pages_matrix(contexts, ids, T, page_size).sum(axis=0)
    return out


def _footprint(layout, contexts, ids, owners, model, T, page_size, layers) -> Footprint:
    sel = layer_indices(model, layers)
    all_kinds = model.layer_kinds
    kinds = [all_kinds[i] for i in sel]
    n_mla, n_kda = kinds.count(LayerKind.MLA), kinds.count(LayerKind.KDA)
    w = np.zeros(T, dtype=np.int64)
    for kind, n in ((LayerKind.MLA, n_mla), (LayerKind.KDA, n_kda)):
        projs = projections(model, kind)
        per_rank = sum(p.shard_bytes(T) for p in projs) if layout.placement is Placement.SHARDED \
            else sum(p.bytes for p in projs)
        w += n * per_rank
    pages = _owner_pages(layout, contexts, ids, owners, T, page_size) if n_mla else np.zeros(T, np.int64)
    n_indexed = sum(model.stores_indexer_keys(i) for i in sel)  # GLM-5's shared-indexer layers store none
    kv = pages * page_size * model.kv_bytes_per_token_layer * n_mla
    indexer = pages * page_size * model.indexer_bytes_per_token_layer * n_indexed
    rec = np.zeros(T, dtype=np.int64)
    if n_kda and model.kda is not None:
        per_request = model.recurrent_bytes_per_request_layer * n_kda
        started = np.asarray(contexts) > 0  # state exists once a request has a history
        if layout is Layout.TP:
            check_divides(T, model.kda.heads, "kda heads")
            rec += int(started.sum()) * (per_request // T)
        else:
            np.add.at(rec, np.asarray(owners)[started], per_request)
    return Footprint(layout, w, kv, indexer, rec)


def footprint(layout: Layout, batch: Batch, model: ModelProfile, T: int, page_size: int, *,
              layers: Iterable[int] | None = None) -> Footprint:
    """Per-rank footprint of ``batch`` in ``layout`` (Eq 1 for arbitrary, unequal batches).

    Sharded layouts hold 1/T of every projection (T must divide the heads), replicated ones
    all of it; KV and indexer pages follow the placement rules of this module; recurrent
    state is split by head under TP and whole on the owner otherwise. ``layers`` restricts it
    to some layers (a runtime that runs only those).
    """
    check_batch(batch, T)
    return _footprint(layout, batch.contexts, batch.ids, batch.owners, model, T, page_size, layers)


def eq1_footprint(layout: Layout, weight_bytes: float, kv_bytes_per_token: float,
                  batch: int, context: float, T: int) -> float:
    """Eq 1 as printed: per-rank bytes of ``batch`` balanced requests of ``context`` tokens
    (W_A = ``weight_bytes``, k = ``kv_bytes_per_token`` over all cache-bearing layers)."""
    w = weight_bytes / T if layout.placement is Placement.SHARDED else weight_bytes
    kv = batch * kv_bytes_per_token * context
    return w + (kv if layout.ownership is Ownership.ALL else kv / T)


def eq1_longest_context(layout: Layout, budget_bytes: float, weight_bytes: float,
                        kv_bytes_per_token: float, batch: int, T: int) -> float:
    """§2's longest balanced context under a per-rank budget M_avail (Eq 1 solved for s):
    (T M − W)/(Bk) for DOP, T(M − W)/(Bk) for DP and CP, (M − W/T)/(Bk) for TP; 0 if the
    projections alone do not fit."""
    w = weight_bytes / T if layout.placement is Placement.SHARDED else weight_bytes
    share = 1 if layout.ownership is Ownership.ALL else T
    return max(0.0, share * (budget_bytes - w) / (batch * kv_bytes_per_token))


def longest_balanced_context(layout: Layout, model: ModelProfile, T: int, batch: int,
                             budget_bytes: float, page_size: int, *,
                             layers: Iterable[int] | None = None) -> int:
    """The longest context s such that ``batch`` requests of s tokens with round-robin owners
    (:meth:`Batch.balanced`) fit ``budget_bytes`` on every rank, page by page; 0 if not even
    one token fits."""
    ids = np.arange(batch, dtype=np.int64)
    owners = ids % T

    def fits(s: int) -> bool:
        contexts = np.full(batch, s, dtype=np.int64)
        return _footprint(layout, contexts, ids, owners, model, T, page_size, layers).busiest <= budget_bytes

    if not fits(1):
        return 0
    lo, hi = 1, page_size
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 48:
            raise ValueError("the budget fits any context: does the model have cache-bearing layers?")
    while hi - lo > 1:  # invariant: fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
