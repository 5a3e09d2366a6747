"""Vectorised placement: every block of one state of one layer kind, as key arrays, and the
ranks that hold each block in a layout, as bitmasks (bit r set: rank r holds it).

The same rules as :mod:`splash_core.planning.ownership` (and :mod:`blocks`, which
enumerates them one block at a time), over numpy arrays. Every layer of one kind has the
same blocks apart from the layer index, so one universe serves all of them.

Keys are int64 pairs ``[n, 2]``: ``(request_id, page)`` for kv and indexer,
``(request_id, shard)`` for recurrent state, ``(matrix index, shard)`` for weights.
"""

from __future__ import annotations

import functools

import numpy as np

from ...layouts import Layout, Ownership, Placement
from ..ownership import cp_rank_of_page, pages_for

MAX_T = 64


def mask_dtype(T: int) -> type:
    """The narrowest unsigned integer with a bit per rank."""
    if not 1 <= T <= MAX_T:
        raise ValueError(f"the planner supports groups of 1..{MAX_T} ranks (got T = {T})")
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if np.iinfo(dtype).bits >= T:
            return dtype
    raise AssertionError("unreachable")


def full_mask(T: int):
    return mask_dtype(T)((1 << T) - 1)


def rank_bits(ranks, T: int) -> np.ndarray:
    """Bitmask with only bit ``ranks[i]`` set, per element."""
    dtype = mask_dtype(T)
    return np.left_shift(dtype(1), np.asarray(ranks).astype(dtype))


class Universe:
    """All blocks of one state in one layer, in a fixed order both layouts share.

    ``classes[i]`` is block i's size class (weights: its matrix), None when all blocks are
    one size."""

    def __init__(self, keys: np.ndarray, classes: np.ndarray | None, n_classes: int):
        self._keys, self.classes, self.n_classes = keys, classes, n_classes

    @property
    def keys(self) -> np.ndarray:
        """[n, 2] int64 block keys."""
        return self._keys

    def __len__(self) -> int:
        return len(self._keys)


class PageUniverse(Universe):
    """Pages of every request, request by request in batch order, pages ascending. Kept as
    compact int32 columns; the int64 keys are built only when a rank's arrays are asked for."""

    def __init__(self, ids: np.ndarray, request_index: np.ndarray, page: np.ndarray):
        super().__init__(None, None, 1)
        self.ids, self.request_index, self.page = ids, request_index, page

    @functools.cached_property
    def keys(self) -> np.ndarray:
        return np.stack([self.ids[self.request_index], self.page.astype(np.int64)], axis=1)

    def __len__(self) -> int:
        return len(self.page)


def page_universe(ids: np.ndarray, contexts: np.ndarray, page_size: int) -> PageUniverse:
    counts = pages_for(contexts, page_size)
    request_index = np.repeat(np.arange(len(ids), dtype=np.int32), counts)
    starts = (np.cumsum(counts) - counts).astype(np.int32)
    page = np.arange(int(counts.sum()), dtype=np.int32) - np.repeat(starts, counts)
    return PageUniverse(np.asarray(ids, dtype=np.int64), request_index, page)


def page_masks(layout: Layout, universe: PageUniverse, ids: np.ndarray, owners: np.ndarray,
               T: int) -> np.ndarray:
    """Holders of every page: all ranks (TP), the owner (DP, DOP), the page's rotation rank (CP)."""
    if layout.ownership is Ownership.ALL:
        return np.full(len(universe), full_mask(T))
    if layout.ownership is Ownership.OWNER:
        return rank_bits(owners, T)[universe.request_index]
    # (page + id) mod T == (page + id mod T) mod T: the small form keeps the arithmetic in int32
    id_residue = (np.asarray(ids, dtype=np.int64) % T).astype(np.int32)
    return rank_bits(cp_rank_of_page(id_residue[universe.request_index], universe.page, T), T)


def shard_universe(first: np.ndarray, T: int, *, sized_by_first: bool) -> Universe:
    """Keys ``(first[i], shard)`` for every i and shard, i-major. ``sized_by_first``: block
    sizes differ by ``first`` (weights: one class per matrix); else all blocks are one size."""
    n = len(first)
    keys = np.stack([np.repeat(first, T), np.tile(np.arange(T, dtype=np.int64), n)], axis=1)
    if sized_by_first:
        return Universe(keys, np.repeat(np.arange(n, dtype=np.int64), T), n)
    return Universe(keys, None, 1)


def weight_masks(layout: Layout, universe: Universe, T: int) -> np.ndarray:
    """Holders of weight shard keys: rank ``shard`` when sharded, every rank when replicated."""
    if layout.placement is Placement.SHARDED:
        return rank_bits(universe.keys[:, 1], T)
    return np.full(len(universe), full_mask(T))


def recurrent_masks(layout: Layout, universe: Universe, owners: np.ndarray, T: int) -> np.ndarray:
    """Holders of recurrent shard keys: rank ``shard`` under TP, the request's owner otherwise."""
    if layout is Layout.TP:
        return rank_bits(universe.keys[:, 1], T)
    return rank_bits(np.repeat(owners, T), T)
