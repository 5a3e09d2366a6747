"""Where a pool puts a request's new pages: right after the pages it already holds, so that a
history stays in a few long runs of consecutive pages.

A live switch pulls a layer's pages one copy per run (:mod:`.switch.page_pulls`), and a copy
is worth it only for long runs (on an H200 about 4 MiB, some 57 DeepSeek-V3 pages). A free
list used as a stack hands decode's page-at-a-time openings out in the batch's order, so
every request's history ends up interleaved with the others' one page at a time
(``bench/page_runs.py``, a simulated RL rollout and steady serving of 16 requests up to 128K
tokens: 1.0-1.2 consecutive pages a run, 1.8-23 even where a pitched copy takes every k-th page;
placed as below, 83-1834 pages a run, 126 or more on average). A stack does have one virtue:
pages freed by a discard (a switch to CP keeps every T-th page) come back, on the switch back,
into the holes they left. Here, with the request's pages taken in logical order:

- a run of new pages that follows a page the request holds continues right after that page's
  physical page, as far as pages there are free (:func:`continue_runs`): decode's and prefill's
  growth, and pages coming back into a discard's holes (the pool takes these only where all of
  a request's new pages find their holes, so stray single pages do not cut its runs);
- the rest continue from the page after the request's last page below them (its *anchor*),
  as far as pages there are free;
- the rest go into the largest free extent: at its start where it begins the pool, else in its
  middle, which leaves half the gap for the request's own growth and half for the request
  before the gap (whose history ends at the gap's start), so a batch opening together spreads
  over the pool by halving its gaps;
- where no extent is large enough, the lowest free pages: a pool that a discard left with
  every T-th page free then gives a run of every T-th page, which one pitched copy takes.

The rule depends only on the free pages and the requests' held pages, so layers in the same
state place their pages alike (the pool places a large key set once for all of them:
:meth:`~splash_core.runtime.page_keys.PageKeys.placed`). :func:`continue_runs` and
:func:`place` are pure apart from marking the pages they hand out in ``free``.
"""

from __future__ import annotations

import numpy as np


class _Extents:
    """The maximal runs of free pages, computed from the mask when first asked for, then kept
    in step with what :func:`place` takes from one of them (arrays: a pool fragmented by a
    discard has thousands)."""

    def __init__(self, free: np.ndarray):
        bounds = np.concatenate([[0], np.flatnonzero(free[1:] != free[:-1]) + 1, [free.size]])
        is_free = free[bounds[:-1]]
        self.starts, self.lengths = bounds[:-1][is_free], np.diff(bounds)[is_free]

    def largest(self) -> tuple[int, int]:
        """(start, length) of the largest extent (the first of equals); length 0 when none is left."""
        if not self.lengths.size:
            return -1, 0
        e = int(np.argmax(self.lengths))
        return int(self.starts[e]), int(self.lengths[e])

    def take(self, first: int, count: int) -> None:
        """Pages ``[first, first + count)``, all free and inside one extent, are taken. In place
        unless the extent splits in two (an extent taken whole stays, empty)."""
        e = int(np.searchsorted(self.starts, first, side="right")) - 1
        left = first - int(self.starts[e])
        right = int(self.lengths[e]) - left - count
        if left and right:
            self.lengths[e] = left
            self.starts = np.concatenate((self.starts[:e + 1], [first + count], self.starts[e + 1:]))
            self.lengths = np.concatenate((self.lengths[:e + 1], [right], self.lengths[e + 1:]))
        elif left:
            self.lengths[e] = left
        else:
            self.starts[e], self.lengths[e] = first + count, right


def continue_runs(free: np.ndarray, anchors: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[sum(lengths)]: for run j of ``lengths[j]`` pages meant to go right after a page the
    request holds, at ``anchors[j]`` on (-1: none), page ``anchors[j] + i`` for its i-th page
    where that page and every one before it in the run are free, else -1; marks them taken in
    ``free``. In a few array operations, for any number of runs: the anchors must follow
    distinct held pages, so no two runs can claim the same free page (checked)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    run_starts = np.cumsum(lengths) - lengths
    anchor = np.repeat(np.asarray(anchors, dtype=np.int64), lengths)
    page = anchor + np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(run_starts, lengths)
    ok = (anchor >= 0) & (page < free.size)
    ok[ok] = free[page[ok]]
    misses = np.cumsum(~ok)
    ok &= misses == np.repeat(misses[run_starts] - ~ok[run_starts], lengths)  # only each run's free prefix
    given = page[ok]
    free_before = np.count_nonzero(free)
    free[given] = False
    if free_before - np.count_nonzero(free) != given.size:
        raise RuntimeError("page placement: two runs claimed the same page")
    return np.where(ok, page, -1)


def place(free: np.ndarray, anchors: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Physical pages for ``counts[j]`` new pages of each request j, in request order and within
    a request in the order its pages are to be used, concatenated; they are marked taken in
    ``free`` ([num_pages] bool). ``anchors[j]``: the page request j's new pages should start at
    (-1: none). Hands out fewer pages where fewer are free."""
    anchors, counts = np.asarray(anchors, np.int64), np.asarray(counts, np.int64)
    num_pages = free.size
    out: list[np.ndarray] = []
    extents: _Extents | None = None
    cap: int | None = None  # once known: no gap is longer
    lowest = 0  # no page below it is free
    for anchor, need in zip(anchors.tolist(), counts.tolist()):
        if 0 <= anchor < num_pages and need and free[anchor]:
            ahead = free[anchor: anchor + need]
            k = ahead.size if ahead.all() else int(np.argmin(ahead))
            if k:
                out.append(np.arange(anchor, anchor + k, dtype=np.int64))
                free[anchor: anchor + k] = False
                if extents is not None:
                    extents.take(anchor, k)
                need -= k
        if need and (cap is None or need <= cap):
            if extents is None:
                extents = _Extents(free)
            start, length = extents.largest()
            if length >= need:
                first = start if start == 0 else start + (length - need) // 2
                out.append(np.arange(first, first + need, dtype=np.int64))
                free[first: first + need] = False
                extents.take(first, need)
                need = 0
            else:
                cap = length  # no gap grows: none holds more later
        if need:  # no gap holds the rest: the lowest free pages
            rest, lowest = _lowest_free(free, need, lowest)
            out.append(rest)
            free[rest] = False
            extents = None
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _lowest_free(free: np.ndarray, need: int, lowest: int) -> tuple[np.ndarray, int]:
    """The ``need`` lowest free pages (fewer where fewer are free) at or above ``lowest`` (no page
    below it is free), scanning windows of the mask rather than all of it; and the page after
    the last one."""
    found, at = [], lowest
    while need and at < free.size:
        window = max(4 * need, 4096)
        pages = np.flatnonzero(free[at: at + window])[:need] + at
        found.append(pages)
        need -= pages.size
        at = int(pages[-1]) + 1 if need == 0 else at + window
    pages = np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)
    return pages, at
