"""The ownership model (paper §2, Eq 1, Table 2): who holds what in each layout.

Placement rules every part of SPLASH shares (planner, runtime, cost model):

- weights: sharded layouts give rank r head shard r of every projection; replicated layouts
  give every rank all T shards.
- kv / indexer (per token, in pages of ``page_size``): TP puts every page on every rank;
  DP and DOP put a request's pages on its owner; CP puts page p of request i on rank
  ``(p + i) mod T`` (:func:`cp_rank_of_page`), which balances stored tokens to within a page.
- recurrent (per request, KDA): TP splits it by head shard like the projections; DP, DOP and
  CP keep the whole state on the request's owner (CP has no position axis to split it by).

Owners are chosen at admission for every request, whatever the layout, so a later switch into
DP or DOP knows where each history goes.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

from .layouts import Layout, Ownership, Placement


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

def kv_tokens_per_rank(layout: Layout, batch: Batch, T: int, page_size: int) -> np.ndarray:
    """Tokens of history each rank stores in one cache-bearing layer."""
    out = np.zeros(T, dtype=np.int64)
    if layout.ownership is Ownership.ALL:
        out += int(batch.contexts.sum())
    elif layout.ownership is Ownership.OWNER:
        np.add.at(out, batch.owners, batch.contexts)
    else:
        for r in batch.requests:
            out += cp_tokens_per_rank(r.context, r.id, T, page_size)
    return out


def kv_pages_per_rank(layout: Layout, batch: Batch, T: int, page_size: int) -> np.ndarray:
    """Pages each rank holds in one cache-bearing layer (what its pool allocates)."""
    out = np.zeros(T, dtype=np.int64)
    pages = pages_for(batch.contexts, page_size)
    if layout.ownership is Ownership.ALL:
        out += int(pages.sum())
    elif layout.ownership is Ownership.OWNER:
        np.add.at(out, batch.owners, pages)
    else:
        for r in batch.requests:
            out += cp_pages_per_rank(r.context, r.id, T, page_size)
    return out


def recurrent_share_per_rank(layout: Layout, batch: Batch, T: int) -> np.ndarray:
    """Requests' worth of recurrent state each rank holds (TP holds 1/T of every request)."""
    if layout is Layout.TP:
        return np.full(T, len(batch) / T)
    out = np.zeros(T)
    np.add.at(out, batch.owners, 1.0)
    return out


def weight_share(layout: Layout, T: int) -> float:
    """Fraction of the attention projections each rank holds: 1/T sharded, 1 replicated."""
    return 1.0 / T if layout.placement is Placement.SHARDED else 1.0

