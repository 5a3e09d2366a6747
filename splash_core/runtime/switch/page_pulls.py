"""Moving a layer's KV pages by pulls: each rank copies the pages it fetches straight out of the
pool of the rank that holds them into pages it allocated in its own pool
(:class:`~splash_core.platform.interfaces.PeerBuffers`; on accelerators a copy engine does it, so no
packing kernel, staging buffer or collective kernel takes processors from the computation
beside the transfer, and every byte crosses memory once on each side).

A page's physical place in its pool is the holder's own bookkeeping, so before a layer moves
the ranks agree on it: every rank lists, per peer, the physical pages of the keys that peer
fetches from it (as runs of pages at a constant step, usually one per request: consecutive
pages, or every T-th where CP split a history by position), in one host all-gather per layer
(:func:`where_sent` / :func:`received_places`), and the ranks pull only where the runs are
long enough to be worth a copy each (:func:`worth_pulling`). Then per source rank the pulls
are the runs along which both the source's pages and the pages allocated here advance by
constant steps (:func:`pull_runs`), one copy each: a plain one where both sides are
consecutive, else a pitched one (rows of a page, a pitch per side), in bytes of the shared
buffer (:func:`byte_runs`).

No rank may read a page before its holder wrote it, nor after its holder reused it. The pages
mover pulls a layer only after a barrier (:meth:`TransferContext.rendezvous`: the peer memory's
own, or a one-element collective) every rank's side stream reaches once its compute
stream got to the layer the transfer overlaps: a layer that moves after the step wrote the
step's tokens into the pages it sends by then, and every other layer's history was written
before the step. (Rows a rank writes beside a pull into a page it holds go to slots past the
history, which the receiver writes itself before it reads them.) A holder frees its source
pages only when its layer lands, after a barrier that completes once every rank's pulls of the
layer did; and a freed page is written again only after a later allocation, behind a later
collective every rank joins.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...layouts import Primitive
from ...planning.manifest import StatePlan
from ..page_keys import PageKeys


@dataclasses.dataclass(frozen=True)
class PullRoute:
    """What this rank executes for one KV plan in every layer of its kind, by pulls."""

    primitive: Primitive
    arriving: PageKeys  # fetched keys, grouped by source rank, in each source's listing order
    from_each: np.ndarray  # [T] how many of them each rank holds
    sends: tuple[PageKeys | None, ...]  # [T] the keys each peer pulls from this rank (None: none)
    freed: PageKeys
    group_pages: int  # pages received over the group


def build_route(plan: StatePlan, rank: int, T: int) -> PullRoute:
    blocks = plan.rank(rank)
    sends = tuple(PageKeys.of(keys) if p != rank and len(keys) else None for p, keys in enumerate(blocks.sends))
    return PullRoute(plan.primitive, PageKeys.of(blocks.fetched), np.asarray(blocks.recv_splits, dtype=np.int64),
                     sends, PageKeys.of(blocks.freed), int(plan.diff.recv[0].sum()))


def progressions(columns: np.ndarray, pitched: bool = True) -> np.ndarray:
    """[k, 2] (first row, rows) cutting the rows of ``columns`` ([m, c] int64) left to right into
    runs along which every column advances by one positive step (by 1 where not ``pitched``):
    greedily, each run as long as it can be (a run of one row has any step). Vectorized: runs
    are cut from the segments of constant row-to-row differences, of which a run right after
    another takes all but the first row."""
    x = np.asarray(columns, dtype=np.int64)
    m = len(x)
    if m < 2:
        return np.array([[0, m]] * m, dtype=np.int64).reshape(-1, 2)
    x = x.reshape(m, -1)
    bad, change = np.zeros(m - 1, dtype=bool), np.zeros(m - 1, dtype=bool)
    change[0] = True
    for column in x.T:  # column by column: 1-D operations are several times faster than [m, c] ones
        d = np.diff(column)
        bad |= (d <= 0) if pitched else (d != 1)  # a step no run takes: rows of their own
        change[1:] |= d[1:] != d[:-1]
    change[1:] |= bad[1:] | bad[:-1]
    first = np.flatnonzero(change)  # segments of equal differences: differences [first, first + length)
    length = np.diff(np.append(first, m - 1))
    seg_bad = bad[first]
    single = ~seg_bad & (length == 1)
    # taken[k]: segment k's first row already ends the run before it. That holds after a good
    # segment of two or more differences, not after a bad one, and flips along single ones.
    k = np.arange(len(first))
    anchor = np.maximum.accumulate(np.where(single, -1, k))
    prev = np.concatenate([[-1], anchor[:-1]])
    taken_after = np.where(prev >= 0, ~seg_bad[np.maximum(prev, 0)] & (length[np.maximum(prev, 0)] >= 2), False)
    taken = taken_after ^ ((k - prev - 1) % 2 == 1)
    good = ~seg_bad & (length - taken >= 1)
    starts = [first[good] + taken[good], (first[seg_bad & ~taken])]
    counts = [length[good] + 1 - taken[good], np.ones(int((seg_bad & ~taken).sum()), dtype=np.int64)]
    last = len(first) - 1  # the last row is left over after a bad segment or a single one that lost its row
    if seg_bad[last] or (single[last] and taken[last]):
        starts.append(np.array([m - 1]))
        counts.append(np.array([1]))
    starts, counts = np.concatenate(starts), np.concatenate(counts)
    order = np.argsort(starts, kind="stable")
    return np.stack([starts[order], counts[order]], axis=1).astype(np.int64)


def runs(pages: np.ndarray, pitched: bool = True) -> np.ndarray:
    """[k, 3] int64: (first page, length, step) of each run of ``pages`` in arithmetic
    progression with a positive step (consecutive pages: step 1; CP's pages: every T-th; only
    step 1 where not ``pitched``)."""
    pages = np.asarray(pages, dtype=np.int64)
    cut = progressions(pages[:, None], pitched)
    return np.stack([pages[cut[:, 0]], cut[:, 1], _steps(pages[:, None], cut)[:, 0]], axis=1).reshape(-1, 3)


def expand(page_runs: np.ndarray) -> np.ndarray:
    """The pages of :func:`runs`' answer, in order."""
    page_runs = np.asarray(page_runs, dtype=np.int64).reshape(-1, 3)
    if not len(page_runs):
        return np.zeros(0, dtype=np.int64)
    first, length, step = page_runs.T
    within = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
    return np.repeat(first, length) + within * np.repeat(step, length)


def _steps(x: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """[k, c] each run's step per column (1 for a run of one row)."""
    if not len(cut):
        return np.zeros((0, x.shape[1]), dtype=np.int64)
    ahead = np.minimum(cut[:, 0] + 1, len(x) - 1)
    return np.where(cut[:, 1:2] > 1, x[ahead] - x[cut[:, 0]], 1)


def where_sent(pool, route: PullRoute, pitched: bool = True) -> list[np.ndarray | None]:
    """This rank's part of the agreement for one layer: per peer, the runs of the physical pages
    (in ``pool``) of the keys that peer fetches from here, or None."""
    return [None if keys is None else runs(pool.lookup(keys), pitched) for keys in route.sends]


def arriving_breaks(pages: np.ndarray, from_each: np.ndarray, pitched: bool = True) -> list[np.ndarray | None]:
    """This rank's other part of the agreement: per source rank, where the runs of ``pages``
    (the pages it will allocate for the keys it fetches, grouped by source as
    :attr:`PullRoute.arriving` lists them) end, as offsets into that source's keys; or None."""
    out, first = [], 0
    for count in np.asarray(from_each).tolist():
        if not count:
            out.append(None)
            continue
        out.append(np.cumsum(runs(pages[first: first + count], pitched)[:, 1]))
        first += count
    return out


def copies(shared: list) -> int:
    """How many copies the pulls of one layer take over the group, from every rank's
    ``(where_sent, arriving_breaks)``: per source and receiver one per stretch of keys between
    the ends of runs on either side (the same on every rank)."""
    total = 0
    for receiver, (_, breaks) in enumerate(shared):
        for source, ends in enumerate(breaks):
            if ends is not None:
                total += np.union1d(np.cumsum(shared[source][0][receiver][:, 1]), ends).size
    return total


def worth_pulling(pages: int, copies: int, page_bytes: int, min_run_bytes: float) -> bool:
    """Whether ``pages`` pages in ``copies`` copies (over every rank of the group, so every rank
    decides alike) average at least ``min_run_bytes`` a copy. Pages scattered over a pool would
    take a copy each; the pool's placement (:mod:`splash_core.runtime.page_placement`) keeps histories that decode
    grows a page at a time in long runs, but a discard still leaves every T-th page."""
    return copies == 0 or pages * page_bytes >= min_run_bytes * copies


def received_places(shared: list[list], layer: int, rank: int, route: PullRoute) -> list[np.ndarray | None]:
    """Per source rank, the physical pages (in the source's pool) of the keys this rank fetches
    from it in ``layer``, from every rank's :func:`where_sent` answer ``shared[s]``;
    RuntimeError when a source lists a different number of pages than the plan says."""
    out = []
    for s, count in enumerate(route.from_each.tolist()):
        if not count:
            out.append(None)
            continue
        listed = shared[s][rank]
        pages = expand(listed) if listed is not None else np.zeros(0, np.int64)
        if pages.size != count:
            raise RuntimeError(f"layer {layer}: rank {s} lists {pages.size} pages for rank {rank}, "
                               f"whose plan fetches {count} from it")
        out.append(pages)
    return out


def pull_runs(src: np.ndarray, dst: np.ndarray, pitched: bool = True) -> np.ndarray:
    """[k, 5] int64 (source page, destination page, pages, source step, destination step) of the
    runs along which both ``src`` and ``dst`` (the same length) advance by constant steps: one
    copy each (a pitched one where a step is not 1; none such where not ``pitched``)."""
    both = np.stack([np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)], axis=1)
    cut = progressions(both, pitched)
    steps = _steps(both, cut)
    return np.concatenate([both[cut[:, 0]], cut[:, 1:2], steps], axis=1).reshape(-1, 5)


def byte_runs(page_runs: np.ndarray, offset: int, page_bytes: int) -> np.ndarray:
    """``page_runs`` (:func:`pull_runs`) as the copies of :meth:`PeerBuffers.pull`: [k, 6]
    (source byte, destination byte, row bytes, rows, source pitch, destination pitch) in a
    buffer whose pages of this tensor start at byte ``offset`` on every rank, ``page_bytes``
    each. A run of consecutive pages on both sides is one row."""
    page_runs = np.asarray(page_runs, dtype=np.int64).reshape(-1, 5)
    src, dst, n, src_step, dst_step = page_runs.T
    flat = (src_step == 1) & (dst_step == 1) | (n == 1)
    width = np.where(flat, n, 1) * page_bytes
    return np.stack([src * page_bytes + offset, dst * page_bytes + offset, width, np.where(flat, 1, n),
                     np.where(flat, width, src_step * page_bytes), np.where(flat, width, dst_step * page_bytes)],
                    axis=1).astype(np.int64)
