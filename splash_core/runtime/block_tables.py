"""Block tables and free pages of one layer's pool on one rank: the host bookkeeping of the
paged KV pool (numpy only; :class:`~splash_core.runtime.kv_pool.LayerKV` adds the page tensors).

A request's block table maps its *logical* pages (position // page_size) to physical pages;
-1 marks a logical page held elsewhere (CP) or not at all. The tables of a layer are the rows
of one dense array (a request holding pages has a row; rows are reused) and the free pages a
mask; new pages go where they keep each history in long runs (:mod:`.page_placement`), so a
switch pulls it in few copies. Work on many pages of many requests, as a live switch does in
every layer, is a few array operations: :class:`PageKeys` prepares a set of (request, page) keys once
(per switch plan) and :meth:`BlockTables.lookup`, :meth:`~BlockTables.alloc_keys` and
:meth:`~BlockTables.free_keys` apply it to any layer. Allocation checks everything before it
changes anything (:class:`PoolFullError`, ValueError), so a refused call leaves the tables as
they were.
"""

from __future__ import annotations

import numpy as np

from .page_keys import PageKeys, PoolFullError
from .page_placement import continue_runs, place

MEMO_KEYS = 256  # key sets at least this large are placed once for every layer in the same state
FEW_KEYS = 64  # key sets up to this large are placed key by key


class BlockTables:
    """Block tables and free pages of ``num_pages`` pages of layer ``layer`` on this rank."""

    def __init__(self, layer: int, num_pages: int):
        if num_pages < 1:
            raise ValueError(f"layer {layer}: a pool needs at least one page (got {num_pages})")
        self.layer = layer
        self._free = np.ones(num_pages, dtype=bool)  # which physical pages are free
        self._nfree = num_pages
        self._row: dict[int, int] = {}  # request -> row of _table, for requests holding pages
        self._spare: list[int] = []  # rows no request uses
        self._table = np.full((0, 0), -1, dtype=np.int32)  # [row, logical page] -> physical page, -1: none
        self._held = np.zeros(0, dtype=np.int64)  # pages held per row
        self.version = 0  # bumped on every change of a table
        self._changed: set[int] | None = None  # requests whose tables changed, while someone follows them

    def follow_changes(self) -> None:
        """From now on, remember which requests' tables change (:meth:`drain_changes`): what a
        copy of the tables elsewhere (on the device) must update."""
        if self._changed is None:
            self._changed = set(self._row)

    def drain_changes(self) -> set[int]:
        """The requests whose tables changed since the last call (all holding pages, on the first)."""
        changed, self._changed = self._changed or set(), set()
        return changed

    @property
    def num_pages(self) -> int:
        return self._free.size

    @property
    def free_pages(self) -> int:
        return self._nfree

    @property
    def used_pages(self) -> int:
        return self.num_pages - self._nfree

    @property
    def requests(self) -> list[int]:
        """Requests with at least one page here."""
        return list(self._row)

    # ---- rows of the dense table ---------------------------------------------------------

    def _rows(self, requests, create: bool = False) -> np.ndarray:
        """Row of each request (-1 for one without pages, unless ``create`` gives it a row)."""
        out = np.empty(len(requests), dtype=np.intp)
        for i, rid in enumerate(requests):
            row = self._row.get(rid)
            if row is None:
                row = self._new_row(rid) if create else -1
            out[i] = row
        return out

    def _new_row(self, request: int) -> int:
        if self._spare:
            row = self._spare.pop()
        else:
            row = len(self._row)
            if row >= self._table.shape[0]:
                grow = max(8, self._table.shape[0])
                self._table = np.concatenate([self._table, np.full((grow, self._table.shape[1]), -1, np.int32)])
                self._held = np.concatenate([self._held, np.zeros(grow, np.int64)])
        self._row[request] = row
        return row

    def _widen(self, max_page: int) -> None:
        width = self._table.shape[1]
        if max_page >= width:
            grow = max(max_page + 1 - width, width, 8)
            self._table = np.concatenate([self._table, np.full((self._table.shape[0], grow), -1, np.int32)], axis=1)

    def _drop_empty(self, requests) -> None:
        for rid in requests:
            row = self._row.get(rid)
            if row is not None and self._held[row] == 0:
                del self._row[rid]
                self._spare.append(row)

    # ---- many keys at once ----------------------------------------------------------------

    def _flat(self, keys: PageKeys) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows of the keys' requests, the keys' flat table indices), or None when a request
        has no row or a page lies beyond the table."""
        rows = self._rows(keys.requests)
        if keys.max_page >= self._table.shape[1] or (rows < 0).any():
            return None
        return rows, keys.flat(rows, self._table.shape[1])

    def lookup(self, keys: PageKeys) -> np.ndarray:
        """Physical pages of ``keys``, in order; RuntimeError naming a request when a key is not held here."""
        if len(keys) == 0:
            return np.zeros(0, np.int64)
        found = self._flat(keys)
        physical = np.take(self._table, found[1]) if found else np.full(len(keys), -1, np.int32)
        if found is None or (physical < 0).any():
            held = self._held_mask(keys)
            bad = int(np.flatnonzero(~held)[0])
            raise RuntimeError(f"layer {self.layer}: request {keys.requests[keys.slot[bad]]} holds no page "
                               f"{int(keys.pages[bad])} here")
        return physical.astype(np.int64)

    def _held_mask(self, keys: PageKeys) -> np.ndarray:
        """Whether each key is held here (any keys: unknown requests, pages beyond the table)."""
        r = self._rows(keys.requests)[keys.slot]
        inside = (r >= 0) & (keys.pages < self._table.shape[1])
        held = np.zeros(len(keys), dtype=bool)
        held[inside] = self._table[r[inside], keys.pages[inside]] >= 0
        return held

    def alloc_keys(self, keys: PageKeys) -> np.ndarray:
        """Allocate every key (none may be held already); their physical pages, in order. Raises
        :class:`PoolFullError` or ValueError changing nothing."""
        n = len(keys)
        if n == 0:
            return np.zeros(0, np.int64)
        if n > self._nfree:
            who = f"request {keys.requests[0]} needs" if len(keys.requests) == 1 else f"{len(keys.requests)} requests need"
            raise PoolFullError(f"layer {self.layer}: {who} {n} pages, {self._nfree} of {self.num_pages} are free")
        rows = self._rows(keys.requests, create=True)
        self._widen(keys.max_page)
        flat = keys.flat(rows, self._table.shape[1])
        if (np.take(self._table, flat) >= 0).any():
            self._drop_empty(keys.requests)
            held = keys.pages[np.take(self._table, flat) >= 0]
            who = f"request {keys.requests[0]}" if len(keys.requests) == 1 else f"requests {list(keys.requests)}"
            raise ValueError(f"layer {self.layer}: {who} already holds some of pages {held.tolist()[:16]}")
        physical = self._place(keys, self._free)
        if physical.size != n:  # cannot happen with n pages free; never write a short answer
            self._free[physical] = True
            self._drop_empty(keys.requests)
            raise RuntimeError(f"layer {self.layer}: placed {physical.size} of {n} pages with {self._nfree} free")
        np.put(self._table, flat, physical)
        self._nfree -= n
        self._held[rows] += keys.counts
        self._changes(keys)
        return physical

    def placement(self, keys: PageKeys) -> np.ndarray:
        """The physical pages :meth:`alloc_keys` would give ``keys`` now, in order, changing
        nothing (fewer where fewer pages are free)."""
        return self._place(keys, self._free.copy())

    def _place(self, keys: PageKeys, free: np.ndarray) -> np.ndarray:
        """Physical pages for ``keys``, in the keys' order (fewer where fewer are free); marks
        them taken in ``free``. A large key set is placed afresh only where it was last placed in
        a pool in another state (:meth:`PageKeys.placed`)."""
        if len(keys) == 0:
            return np.zeros(0, np.int64)
        rows = self._rows(keys.requests)
        if len(keys) < MEMO_KEYS:  # a step's few new pages: cheaper placed than looked up
            physical = self._place_afresh(keys, free, rows)
            return physical[physical >= 0]
        holding = rows[rows >= 0]
        holding = holding[self._held[holding] > 0]
        state = (free.copy(), np.isin(rows, holding), self._table[holding])
        physical = keys.placed(state)
        if physical is None:
            physical = self._place_afresh(keys, free.copy(), rows)
            keys.remember_placed(state, physical)
        physical = physical[physical >= 0]
        free[physical] = False
        return physical.copy()

    def _place_afresh(self, keys: PageKeys, free: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Physical pages for ``keys`` in their order (-1 where none was free), marked taken in
        ``free``. Two passes over each request's new pages in logical order:

        1. a run of consecutive new pages that follows a page the request holds continues right
           after that page's physical page, as far as pages there are free
           (:func:`~splash_core.runtime.page_placement.continue_runs`): a decode step's or a
           prefill chunk's pages, and pages coming back into the holes a discard left (where a
           request's new pages lie in several runs, only if every one of them finds its hole);
        2. the rest of each request's pages by :func:`~splash_core.runtime.page_placement.place`,
           from the page after the last one it holds or just got below them."""
        n = len(keys)
        order = keys.by_request()
        pages = keys.pages if order is None else keys.pages[order]
        slot = keys.slot if order is None else keys.slot[order]
        rows = rows[slot]
        starts = np.flatnonzero(np.concatenate([[True], (slot[1:] != slot[:-1]) | (pages[1:] != pages[:-1] + 1)]))
        physical = self._continue_few(free, pages, slot, rows) if n <= FEW_KEYS else \
            self._continue(free, pages, rows, starts)
        # a request whose new pages lie in several runs keeps pass 1's pages only if all of them
        # got one (holes refilled); else single pages after its held ones would cut its new
        # pages into many runs: pass 2 places them all together
        got = physical >= 0
        per = len(keys.requests)
        undo = (np.bincount(slot[starts], minlength=per) > 1) & (np.bincount(slot[~got], minlength=per) > 0)
        back = got & undo[slot]
        if back.any():
            free[physical[back]] = True
            physical[back] = -1
        left = np.flatnonzero(physical < 0)
        if left.size:
            heads = np.flatnonzero(np.concatenate([[True], slot[left][1:] != slot[left][:-1]]))
            anchors = np.array([self._anchor(int(rows[i]), int(pages[i]), physical[i - 1] + 1
                                             if i and slot[i - 1] == slot[i] and pages[i - 1] == pages[i] - 1
                                             and physical[i - 1] >= 0 else -1)
                                for i in left[heads].tolist()], dtype=np.int64)
            got = place(free, anchors, np.diff(np.append(heads, left.size)))
            physical[left[: got.size]] = got
        if order is not None:
            out = np.empty(n, dtype=np.int64)
            out[order] = physical
            physical = out
        return physical  # -1 where the pool ran out

    def _continue(self, free, pages, rows, starts) -> np.ndarray:
        """Pass 1 of :meth:`_place_afresh` over keys sorted by request and page (their ``rows``;
        runs of consecutive pages of a request begin at ``starts``): each key's page, or -1."""
        n, width = pages.size, self._table.shape[1]
        first, row = pages[starts], rows[starts]
        follows = (row >= 0) & (first > 0) & (first <= width)
        before = np.full(starts.size, -1, dtype=np.int64)
        before[follows] = self._table[row[follows], first[follows] - 1]
        return continue_runs(free, np.where(before >= 0, before + 1, -1), np.diff(np.append(starts, n)))

    def _continue_few(self, free, pages, slot, rows) -> np.ndarray:
        """:meth:`_continue` key by key, for a few keys (a step's new pages), where array
        operations cost more than they save."""
        width, num_pages, table = self._table.shape[1], free.size, self._table
        out, last = [], (-1, -1, -1)  # (slot, page, physical) of the key before
        for s, p, r in zip(slot.tolist(), pages.tolist(), rows.tolist()):
            if last[0] == s and last[1] == p - 1:
                before = last[2]
            else:
                before = int(table[r, p - 1]) if r >= 0 and 0 < p <= width else -1
            page = before + 1 if 0 <= before < num_pages - 1 and free[before + 1] else -1
            if page >= 0:
                free[page] = False
            out.append(page)
            last = (s, p, page)
        return np.array(out, dtype=np.int64)

    def _anchor(self, row: int, page: int, after_new: int) -> int:
        """Where a request's new pages from logical ``page`` on should start: ``after_new`` (the
        page after one it just got) where given, else the page after the last one it holds below
        ``page``, else -1."""
        if after_new >= 0 or row < 0:
            return after_new
        below = self._table[row, : min(page, self._table.shape[1])]
        held = np.flatnonzero(below >= 0)
        return int(below[held[-1]]) + 1 if held.size else -1

    def free_keys(self, keys: PageKeys) -> int:
        """Return the pages of ``keys`` to the free pages (keys not held are skipped); returns how many."""
        if len(keys) == 0:
            return 0
        found = self._flat(keys)
        if found is None:  # some requests or pages are not here at all: keep the keys that are
            held = self._held_mask(keys)
            if not held.any():
                return 0
            keys = PageKeys.of(np.stack([np.asarray(keys.requests)[keys.slot[held]], keys.pages[held]], axis=1))
            found = self._flat(keys)
        rows, flat = found
        physical = np.take(self._table, flat)
        counts = keys.counts
        if (physical < 0).any():
            held = physical >= 0
            flat, physical, counts = flat[held], physical[held], np.bincount(keys.slot[held], minlength=len(rows))
        np.put(self._table, flat, -1)
        k = physical.size
        self._free[physical] = True
        self._nfree += k
        self._held[rows] -= counts
        self._drop_empty(keys.requests)
        self._changes(keys)
        return int(k)

    def _changes(self, keys: PageKeys) -> None:
        self.version += 1
        if self._changed is not None:
            self._changed.update(keys.requests)

    # ---- one request -----------------------------------------------------------------------

    def pages_of(self, request: int) -> tuple[np.ndarray, np.ndarray]:
        """(logical pages, physical pages) of ``request`` held here, in logical order."""
        row = self._row.get(request)
        if row is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        table = self._table[row]
        logical = np.flatnonzero(table >= 0)
        return logical, table[logical].astype(np.int64)

    def alloc(self, request: int, logical_pages) -> np.ndarray:
        """Physical pages for ``logical_pages`` of ``request`` (none may be held already).

        Raises :class:`PoolFullError` (changing nothing) when fewer pages are free."""
        return self.alloc_keys(PageKeys.one(request, logical_pages))

    def free(self, request: int, logical_pages=None) -> int:
        """Return pages of ``request`` (all it holds by default) to the free pages; returns how many."""
        if logical_pages is None:
            logical_pages = self.pages_of(request)[0]
        return self.free_keys(PageKeys.one(request, np.unique(np.asarray(logical_pages, dtype=np.int64))))

    def adopt(self, source: int, target: int) -> int:
        """Hand every page ``source`` holds to ``target``, at the same logical and physical pages
        (nothing is copied): how a pre-copy's pages, held under an id of their own, join their
        request. ValueError, changing nothing, where ``target`` holds one of those logical pages
        already. Returns how many pages moved."""
        row = self._row.get(source)
        if row is None:
            return 0
        logical = np.flatnonzero(self._table[row] >= 0)
        to = int(self._rows([target], create=True)[0])
        if (self._table[to, logical] >= 0).any():
            self._drop_empty([target])
            raise ValueError(f"layer {self.layer}: request {target} already holds some of pages {logical.tolist()[:16]}")
        self._table[to, logical] = self._table[row, logical]
        self._table[row, logical] = -1
        self._held[to] += logical.size
        self._held[row] -= logical.size
        self._drop_empty([source])
        self.version += 1
        if self._changed is not None:
            self._changed.update((source, target))
        return int(logical.size)

    def compact(self, request_ids: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``request_ids`` in order: (dense logical -> physical table [R, P] up to the last page
        any of them holds, kernel block table [R, W] listing each request's held pages in logical
        order and their page index [R, W], -1 padded), int32."""
        rows = self._rows(request_ids)
        dense = np.full((len(request_ids), self._table.shape[1]), -1, dtype=np.int32)
        dense[rows >= 0] = self._table[rows[rows >= 0]]
        used = np.flatnonzero((dense >= 0).any(axis=0))
        dense = dense[:, : used[-1] + 1 if used.size else 0]
        held = dense >= 0
        counts = held.sum(axis=1)
        width = int(counts.max(initial=0))
        keep = np.arange(width) < counts[:, None]
        if np.array_equal(held[:, :width], keep):  # every request holds a prefix of its pages (not CP)
            table, order = dense[:, :width].copy(), np.broadcast_to(np.arange(width), keep.shape)
        else:  # each row's held pages first, in logical order
            order = np.argsort(~held, axis=1, kind="stable")[:, :width]
            table = np.where(keep, np.take_along_axis(dense, order, axis=1), -1)
        return dense, table, np.where(keep, order, -1).astype(np.int32)
