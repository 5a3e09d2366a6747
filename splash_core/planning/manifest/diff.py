"""The set difference of Eq 2–3 over holder bitmasks: what each rank keeps, frees and
fetches (and from whom) when every block's holders change from ``src`` to ``dst``.

Rank r keeps a block it holds and still needs, frees one it holds and no longer needs, and
fetches one it needs and lacks. A fetched block comes from the one rank holding it in the
source layout; where several hold it, the choice is deterministic and spreads the load:
holder ``(key[0] + key[1] + r) mod #holders`` in ascending rank order.

Counts per rank are computed eagerly and cheaply: blocks sharing the same (source holders,
destination holders, size class) behave alike, so one histogram over those triples gives
every rank's kept / freed / fetched counts. The explicit key arrays a rank executes
(:class:`RankBlocks`) are built on first request and cached.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .universe import Universe, mask_dtype


@dataclasses.dataclass(frozen=True, eq=False)
class RankBlocks:
    """One rank's part of one state of one layer. Keys as in :mod:`.universe`.

    ``fetched`` is grouped by source rank (ascending), each group in universe order, so
    ``recv_splits`` are the all-to-all receive counts; ``sends[q]`` lists, in the order peer
    q receives them, the keys this rank sends to q (``sends[rank]`` is empty).
    """

    rank: int
    kept: np.ndarray  # [k, 2] held in both layouts: stays in place
    freed: np.ndarray  # [f, 2] held now, not needed after: freed once the layer's transfer lands
    fetched: np.ndarray  # [g, 2] needed and missing: received
    sources: np.ndarray  # [g] the rank each fetched key comes from
    sends: tuple[np.ndarray, ...]  # [T] of [s_q, 2]

    @property
    def recv_splits(self) -> np.ndarray:
        return np.bincount(self.sources, minlength=len(self.sends)).astype(np.int64)

    @property
    def send_splits(self) -> np.ndarray:
        return np.array([len(s) for s in self.sends], dtype=np.int64)


class BlockDiff:
    """Kept / freed / fetched blocks of every rank for one universe (see the module docstring).

    Counts are per size class c (weights: one class per matrix) and rank:
    ``kept[c, r]``, ``freed[c, r]``, ``recv[c, dst, src]`` (blocks dst fetches from src).
    """

    def __init__(self, universe: Universe, src: np.ndarray, dst: np.ndarray, T: int):
        self.universe, self.src, self.dst, self.T = universe, src, dst, T
        self._dtype = mask_dtype(T)
        self._single_cache: np.ndarray | None = None
        self._fetch: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._ranks: dict[int, RankBlocks] = {}
        C = universe.n_classes
        self.kept = np.zeros((C, T), dtype=np.int64)
        self.freed = np.zeros((C, T), dtype=np.int64)
        self.recv = np.zeros((C, T, T), dtype=np.int64)
        full = (1 << T) - 1
        self.fetched_anywhere, self.lands_everywhere = False, True
        # every block with the same (source holders, destination holders, size class) is
        # kept, freed and fetched alike: count those triples, then reason per triple
        for sm, dm, c, n in _triples(src, dst, universe.classes, C, T):
            if dm & ~sm:
                self.fetched_anywhere = True
                self.lands_everywhere &= dm == full
            for r in range(T):
                holds, needs = sm >> r & 1, dm >> r & 1
                if holds:
                    (self.kept if needs else self.freed)[c, r] += n
                elif needs:
                    self._count_fetch(sm, dm, c, n, r)

    def __getstate__(self) -> dict:
        """Without the per-rank caches: a diff sent to the group (a switch planned on rank 0)
        carries the counts and masks, and each rank builds only its own key arrays."""
        state = dict(self.__dict__)
        state.update(_single_cache=None, _fetch={}, _ranks={})
        return state

    def _count_fetch(self, sm: int, dm: int, c: int, n: int, r: int) -> None:
        if sm == 0:
            raise ValueError("a block the destination needs is held by no rank in the source layout")
        if sm & (sm - 1) == 0:  # one holder: it sends all n
            self.recv[c, r, sm.bit_length() - 1] += n
            return
        same = (self.src == sm) & (self.dst == dm)
        if self.universe.classes is not None:
            same &= self.universe.classes == c
        self.recv[c, r] += np.bincount(self._sources(np.flatnonzero(same), r), minlength=self.T)

    @property
    def _single(self) -> np.ndarray:
        if self._single_cache is None:
            self._single_cache = _single_holder(self.src, self.T)
        return self._single_cache

    def _bits(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        bit = self._dtype(1 << r)
        return (self.src & bit) != 0, (self.dst & bit) != 0

    def _sources(self, idx: np.ndarray, r: int) -> np.ndarray:
        """Source rank of each block ``idx`` that rank r fetches."""
        out = self._single[idx].astype(np.int64)
        multi = np.flatnonzero(out < 0)
        if len(multi):
            masks = self.src[idx[multi]]
            keys = self.universe.keys[idx[multi]]
            for mask in np.unique(masks):
                holders = np.array([b for b in range(self.T) if (int(mask) >> b) & 1], dtype=np.int64)
                if not len(holders):
                    raise ValueError("a block the destination needs is held by no rank in the source layout")
                sel = masks == mask
                out[multi[sel]] = holders[(keys[sel, 0] + keys[sel, 1] + r) % len(holders)]
        return out

    def fetch_of(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Universe indices rank r fetches, grouped by source, and their sources."""
        if r not in self._fetch:
            hold, need = self._bits(r)
            idx = np.flatnonzero(need & ~hold)
            sources = self._sources(idx, r)
            order = np.argsort(sources.astype(np.int8), kind="stable")  # radix sort on small ints
            self._fetch[r] = (idx[order], sources[order])
        return self._fetch[r]

    def _sent_to(self, r: int, q: int) -> np.ndarray:
        """Universe indices rank r sends to rank q, ascending (the order q receives them in)."""
        hold, need = self._bits(q)
        wanted = need & ~hold
        idx = np.flatnonzero(wanted & (self._single == r))
        shared = np.flatnonzero(wanted & (self._single < 0))  # several holders: ask the chooser
        if len(shared):
            idx = np.union1d(idx, shared[self._sources(shared, q) == r])
        return idx

    def rank(self, r: int) -> RankBlocks:
        """The explicit key arrays of rank ``r`` (cached)."""
        if not 0 <= r < self.T:
            raise ValueError(f"rank {r} is not in a group of T = {self.T}")
        if r not in self._ranks:
            keys = self.universe.keys
            hold, need = self._bits(r)
            idx, sources = self.fetch_of(r)
            sends = tuple(keys[self._sent_to(r, q)] if q != r else keys[:0] for q in range(self.T))
            self._ranks[r] = RankBlocks(r, keys[hold & need], keys[hold & ~need], keys[idx], sources, sends)
        return self._ranks[r]


def _triples(src: np.ndarray, dst: np.ndarray, classes: np.ndarray | None, C: int, T: int):
    """(source mask, destination mask, class, count) of every distinct triple, as ints."""
    cbits = max(1, (C - 1).bit_length())
    if 2 * T + cbits <= 20:  # pack into one small int and histogram it
        code = (src.astype(np.int32) << (T + cbits)) | (dst.astype(np.int32) << cbits)
        if classes is not None:
            code |= classes.astype(np.int32)
        counts = np.bincount(code, minlength=1)
        codes = np.flatnonzero(counts)
        return [(int(k) >> (T + cbits), (int(k) >> cbits) & ((1 << T) - 1), int(k) & ((1 << cbits) - 1),
                 int(counts[k])) for k in codes]
    cls = np.zeros(len(src), dtype=np.uint64) if classes is None else classes.astype(np.uint64)
    rows, counts = np.unique(np.stack([src.astype(np.uint64), dst.astype(np.uint64), cls], axis=1),
                             axis=0, return_counts=True)
    return [(int(a), int(b), int(c), int(n)) for (a, b, c), n in zip(rows, counts)]


def _single_holder(masks: np.ndarray, T: int) -> np.ndarray:
    """The holder's rank where exactly one rank holds a block, else -1 (int8)."""
    if T <= 16:
        table = np.full(1 << T, -1, dtype=np.int8)
        table[1 << np.arange(T)] = np.arange(T, dtype=np.int8)
        return table[masks]
    m = masks.astype(np.uint64)
    single = (m != 0) & ((m & (m - np.uint64(1))) == 0)
    out = np.full(len(m), -1, dtype=np.int8)
    out[single] = np.round(np.log2(m[single].astype(np.float64))).astype(np.int8)
    return out
