"""Moving a layer's KV pages by pulls: each rank copies the pages it fetches straight out of the
pool of the rank that holds them into pages it allocated in its own pool
(:class:`~splash_core.interfaces.PeerBuffers`; on accelerators a copy engine does it, so no
packing kernel, staging buffer or collective kernel takes processors from the computation
beside the transfer, and every byte crosses memory once on each side).

A page's physical place in its pool is the holder's own bookkeeping, so before a layer moves
the ranks agree on it: every rank lists, per peer, the physical pages of the keys that peer
fetches from it (as runs of consecutive pages, usually one per request), in one host
all-gather per layer (:func:`where_sent` / :func:`received_places`), and the ranks pull only
where the runs are long enough to be worth a copy each (:func:`worth_pulling`). Then per
source rank the pulls are the runs along which both the source's pages and the pages
allocated here are consecutive (:func:`pull_runs`), one copy each, in bytes of the shared
buffer (:func:`byte_runs`).

No rank may read a page before its holder wrote it, nor after its holder reused it. The pages
mover pulls a layer only after a collective every rank's side stream reaches once its compute
stream got to the layer the transfer overlaps: a layer that moves after the step wrote the
step's tokens into the pages it sends by then, and every other layer's history was written
before the step. (Rows a rank writes beside a pull into a page it holds go to slots past the
history, which the receiver writes itself before it reads them.) A holder frees its source
pages only when its layer lands, after a collective that completes once every rank's pulls of
the layer did; and a freed page is written again only after a later allocation, behind a later
collective every rank joins.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...layouts import Primitive
from ...manifest import StatePlan
from ..block_tables import PageKeys


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


def runs(pages: np.ndarray) -> np.ndarray:
    """[k, 2] int64: (first page, length) of each run of consecutive ``pages``."""
    pages = np.asarray(pages, dtype=np.int64)
    if pages.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(pages) != 1) + 1])
    return np.stack([pages[starts], np.diff(np.append(starts, pages.size))], axis=1)


def expand(page_runs: np.ndarray) -> np.ndarray:
    """The pages of :func:`runs`' answer, in order."""
    page_runs = np.asarray(page_runs, dtype=np.int64).reshape(-1, 2)
    if not len(page_runs):
        return np.zeros(0, dtype=np.int64)
    first, length = page_runs[:, 0], page_runs[:, 1]
    return np.repeat(first - np.cumsum(length) + length, length) + np.arange(int(length.sum()))


def where_sent(pool, route: PullRoute) -> list[np.ndarray | None]:
    """This rank's part of the agreement for one layer: per peer, the runs of the physical pages
    (in ``pool``) of the keys that peer fetches from here, or None."""
    return [None if keys is None else runs(pool.lookup(keys)) for keys in route.sends]


def worth_pulling(pages: int, copies: int, page_bytes: int, min_run_bytes: float) -> bool:
    """Whether ``pages`` pages in ``copies`` copies (over every rank of the group, so every rank
    decides alike) average at least ``min_run_bytes`` a copy. Pages scattered over a pool (decode
    grows histories a page at a time, discards leave every T-th page) would take a copy each."""
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


def pull_runs(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """[k, 3] int64 (source page, destination page, pages) of the runs along which both ``src``
    and ``dst`` (the same length) are consecutive."""
    if src.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    breaks = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    starts = np.concatenate([[0], breaks])
    return np.stack([src[starts], dst[starts], np.diff(np.append(starts, src.size))], axis=1).astype(np.int64)


def byte_runs(page_runs: np.ndarray, offset: int, page_bytes: int) -> np.ndarray:
    """``page_runs`` as (source byte, destination byte, bytes) in a buffer whose pages of this
    tensor start at byte ``offset`` on every rank, ``page_bytes`` each."""
    out = page_runs * page_bytes
    out[:, :2] += offset
    return out
