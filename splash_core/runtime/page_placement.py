"""Where a pool puts a request's new pages: right after the pages it already holds, so that a
history stays in a few long runs of consecutive pages.

A live switch pulls a layer's pages one copy per run (:mod:`.switch.page_pulls`), and a copy
is worth it only for long runs (on an H200 about 4 MiB, some 57 DeepSeek-V3 pages). A free
list used as a stack hands decode's page-at-a-time openings out in the batch's order, so
every request's history ends up interleaved with the others' one page at a time
(``bench/page_runs.py``, a simulated RL rollout and steady serving of 16 requests up to 128K
tokens: 1.0-1.2 consecutive pages a run, 1.8-23 even where a pitched copy takes every k-th page;
placed as below, 83-1834 pages a run, 126 or more on average). Here:

- a request's new pages continue from the page after the one holding its last page below
  them (its *anchor*), as far as pages there are free;
- the rest go into the largest free extent: at its start where it begins the pool, else in its
  middle, which leaves half the gap for the request's own growth and half for the request
  before the gap (whose history ends at the gap's start), so a batch opening together spreads
  over the pool by halving its gaps;
- where no extent is large enough, the largest ones are taken whole, largest first.

The rule depends only on the free pages and the anchors, so layers in the same state place
their pages alike. :func:`place` is pure apart from marking the pages it hands out in ``free``.
"""

from __future__ import annotations

import bisect

import numpy as np


class _Extents:
    """The maximal runs of free pages (sorted lists: a pool has few), computed from the mask when
    first asked for, then kept in step with what :func:`place` takes."""

    def __init__(self, free: np.ndarray):
        bounds = np.concatenate([[0], np.flatnonzero(free[1:] != free[:-1]) + 1, [free.size]])
        is_free = free[bounds[:-1]]
        self.starts: list[int] = bounds[:-1][is_free].tolist()
        self.lengths: list[int] = np.diff(bounds)[is_free].tolist()

    def largest(self) -> int:
        """Index of the largest extent (the first of equals); -1 when none is left."""
        return self.lengths.index(max(self.lengths)) if self.lengths else -1

    def take(self, first: int, count: int) -> None:
        """Pages ``[first, first + count)``, all free and inside one extent, are taken."""
        e = bisect.bisect_right(self.starts, first) - 1
        left = first - self.starts[e]
        right = self.lengths[e] - left - count
        if left and right:
            self.lengths[e] = left
            self.starts.insert(e + 1, first + count)
            self.lengths.insert(e + 1, right)
        elif left:
            self.lengths[e] = left
        elif right:
            self.starts[e], self.lengths[e] = first + count, right
        else:
            del self.starts[e], self.lengths[e]


def place(free: np.ndarray, anchors: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Physical pages for ``counts[j]`` new pages of each request j, in request order and within
    a request in the order its pages are to be used, concatenated; they are marked taken in
    ``free`` ([num_pages] bool). ``anchors[j]``: the page request j's new pages should start at
    (-1: none). Hands out fewer pages where fewer are free."""
    num_pages = free.size
    out: list[np.ndarray] = []
    extents: _Extents | None = None
    for anchor, need in zip(np.asarray(anchors, np.int64).tolist(), np.asarray(counts, np.int64).tolist()):
        if 0 <= anchor < num_pages and need:
            ahead = free[anchor: anchor + need]
            k = ahead.size if ahead.all() else int(np.argmin(ahead))
            if k:
                out.append(np.arange(anchor, anchor + k, dtype=np.int64))
                free[anchor: anchor + k] = False
                if extents is not None:
                    extents.take(anchor, k)
                need -= k
        while need:
            if extents is None:
                extents = _Extents(free)
            e = extents.largest()
            if e < 0:
                break
            start, length = extents.starts[e], extents.lengths[e]
            k = min(need, length)
            first = start if start == 0 or k == length else start + (length - k) // 2
            out.append(np.arange(first, first + k, dtype=np.int64))
            free[first: first + k] = False
            extents.take(first, k)
            need -= k
    return np.concatenate(out) if out else np.zeros(0, np.int64)
