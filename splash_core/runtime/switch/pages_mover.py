"""Moving a layer's KV pages (and the indexer keys stored in the same pages) between ownerships.

Per layer and rank, from the manifest's :class:`~splash_core.planning.manifest.RankBlocks` of the KV
state (keys ``(request_id, page)``; the indexer state has the same blocks):

- route (once per plan, shared by every layer of the kind: :meth:`PagesMover.prepare`): the
  keys this rank sends, in the order the chunks send them, the keys it fetches, in the order
  the chunks deliver them, the keys it frees, each as :class:`~splash_core.runtime.page_keys.PageKeys`,
  and per chunk the row ranges and splits. Nothing of it depends on the layer.
- send (``start``): one pool lookup of the sent keys' physical pages and one allocation of the
  fetched keys (array operations on the layer's block tables), one host-to-device copy of both
  as a single index tensor (chunks use slices of it), then per chunk one ``MLAKernels.pack``
  per page tensor into a contiguous buffer and one collective, so packing chunk k+1 and
  unpacking chunk k−1 overlap chunk k's transfer. All-to-all: every peer's slice is split alike
  (send/receive splits per chunk). All-gather (into TP, where every rank sends all it holds to
  everyone): each rank's payload is padded to the largest one (padding rows repeat page 0,
  ignored on arrival) and cut into the same row ranges.
- over transfer buffers (:meth:`TransferContext.gather_buffer`, which copy engines move): at
  most ``max_chunks_buffered`` chunks (:class:`~splash_core.profiles.transfer.TransferConfig`), every all-gather in place (pages packed straight into
  this rank's slot; each chunk a buffer of its own), and
  at T = 2 an all-to-all goes as such an all-gather too: a rank sends itself nothing, so the
  exchange is the same, and copy-engine collectives take all-gathers but not uneven all-to-alls.
- land (``finish``): per chunk, wait for its collectives, then one ``unpack`` per source slot
  (one for an all-to-all) writes the pages. They are the destination's new pages, which nothing
  reads before the layer lands, so a later chunk's failure only needs them freed.
- retire: the ``freed`` pages are free again (one array operation); rollback frees
  the allocated ones.
- discard: nothing moves; retire frees ``freed``.

Where the group shares its KV pools (``io.peers``: the pools live in peer memory, see
:mod:`.page_pulls`) and a layer's pages lie in long enough runs, pages are pulled instead: no
route chunks, packs, collectives or unpacks. Per layer: one host collective in which every rank
says where the pages it sends lie and where the runs of the pages it allocates for the arriving
ones end, from which every rank counts the copies and decides alike whether they are long
enough for the peer memory (``min_run_bytes``, :meth:`PagesMover.min_run_bytes`; else the layer moves by
collectives); a barrier every rank's side stream reaches; one copy per run of pages at
constant steps from each source (consecutive pages; or every T-th, as CP holds them, in one
pitched copy); then per state a barrier that
completes once every rank's pulls did. The barriers are the peer memory's own where it has one
(``PeerBuffers.barrier``: then a pulled layer runs no collective on the side communicator),
else one-element collectives (:meth:`TransferContext.rendezvous`).

The step's new tokens never move: the executor reserves their pages in the layout the layer
computes the step in.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Mapping

import numpy as np
import torch

from ...layouts import Layout, Primitive, State
from ...planning.manifest import StatePlan
from ...profiles.transfer import TransferConfig
from ..page_keys import PageKeys
from . import page_pulls
from .page_pulls import PullRoute
from .transfer import Pending, Transfer, TransferContext, byte_view

KV, INDEXER = State.KV, State.INDEXER


@dataclasses.dataclass(frozen=True)
class _Cut:
    """One chunk: rows [send_lo, send_hi) of the send index, a receive buffer of ``recv_rows``
    rows, unpack slots (first row in the receive buffer, rows, offset into the arriving keys),
    and for an all-to-all the (send, receive) splits."""

    send_lo: int
    send_hi: int
    recv_rows: int
    slots: tuple[tuple[int, int, int], ...]
    splits: tuple[list[int], list[int]] | None


@dataclasses.dataclass(frozen=True)
class _Route:
    """What this rank executes for one KV plan in every layer of its kind."""

    primitive: Primitive
    sending: PageKeys  # sent keys, in send-index order (an all-gather pads the index after them)
    send_rows: int  # rows of the send index
    arriving: PageKeys  # fetched keys, in the order the chunks' slots deliver them
    freed: PageKeys
    cuts: tuple[_Cut, ...]
    group_pages: int  # pages received over the group


@dataclasses.dataclass
class _Chunk:
    pendings: list[tuple[State, Pending, torch.Tensor]]  # per page tensor: its collective and receive buffer
    slots: list[tuple[int, int, torch.Tensor]]  # per source: (first row in the receive buffers, rows, pages)


@dataclasses.dataclass
class _Moving:
    route: _Route | PullRoute
    chunks: list[_Chunk]
    allocated: bool = False  # pages were given to the arriving keys (until retire or rollback)
    done: list[Pending] | None = None  # pulls: per state, a collective that completes once every rank's did


class PagesMover:
    """:class:`~splash_core.runtime.switch.transfer.StateMover` for ``State.KV`` and ``State.INDEXER``."""

    states = (KV, INDEXER)

    def __init__(self, transfer: TransferConfig = TransferConfig()):
        """``transfer``: chunking (``chunk_bytes``, ``max_chunks``, ``max_chunks_buffered``) and
        pulls (``pitched_pulls``, ``min_run_bytes``); every layer's agreement and pulls cut runs alike."""
        self._routes: weakref.WeakKeyDictionary[StatePlan, dict] = weakref.WeakKeyDictionary()
        self.transfer = transfer
        self.pitched = transfer.pitched_pulls

    def prepare(self, layer, plans: Mapping[State, StatePlan], rank: int, T: int,
                io: TransferContext | None = None) -> None:
        """Build the routes of ``plans`` for this rank now (planning time), so no layer pays for
        them: the collective one (every layer's transfer starts from it) and, where the pools are
        shared, the pull one."""
        self._route(plans[KV], rank, T, layer.kv.format.page_bytes, buffered=io is not None and io.buffered)
        if io is not None and _pulls(layer, io):
            self._pull_route(plans[KV], rank, T)

    def _pull_route(self, plan: StatePlan, rank: int, T: int) -> PullRoute:
        known = self._routes.setdefault(plan, {})
        if (rank, T, "pull") not in known:
            known[(rank, T, "pull")] = page_pulls.build_route(plan, rank, T)
        return known[(rank, T, "pull")]

    def _route(self, plan: StatePlan, rank: int, T: int, page_bytes: int, *, buffered: bool) -> _Route:
        """The route of ``plan`` for this rank, chunked for pages of ``page_bytes`` (KV and
        indexer keys together: what a chunk carries per row), over transfer buffers where
        ``buffered`` (see the module docstring); built once."""
        known = self._routes.setdefault(plan, {})
        as_gather = buffered and T == 2 and plan.primitive is Primitive.ALL_TO_ALL
        cfg = self.transfer
        chunks = cfg.max_chunks_buffered if buffered else cfg.max_chunks
        key = (rank, T, page_bytes, chunks, as_gather)
        if key not in known:
            known[key] = _build_route(plan, rank, T, page_bytes, chunks, cfg.chunk_bytes, as_gather)
        return known[key]

    def start(self, layer, plans: Mapping[State, StatePlan], dst: Layout, io: TransferContext) -> Transfer:
        plan, pool = plans[KV], layer.kv
        tensors = [(KV, pool.kv)] + ([(INDEXER, pool.indexer)] if pool.indexer is not None else [])
        if (INDEXER in plans) != (pool.indexer is not None):
            raise ValueError(f"layer {layer.index}: the plan and the pool disagree on indexer keys")
        fmt = pool.format
        route = self._route(plan, io.rank, io.T, fmt.page_bytes, buffered=io.buffered)
        page = {KV: fmt.kv_page_bytes, INDEXER: fmt.indexer_page_bytes}
        name = plan.primitive.value
        t = Transfer(layer, tuple(s for s, _ in tensors), {s: name for s, _ in tensors},
                     {s: len(route.arriving) * page[s] for s, _ in tensors},
                     {s: route.group_pages * page[s] for s, _ in tensors})
        t.data = moving = _Moving(route, [])
        if route.primitive is Primitive.DISCARD:
            return t
        places = self._agreed(layer, plan, io)
        if places is not None:
            self._start_pulls(t, plan, places, [s for s, _ in tensors], page, io)
            return t
        payload = pool.lookup(route.sending)
        if route.send_rows > len(payload):  # all-gather padding: page 0, ignored on arrival
            payload = np.concatenate([payload, np.zeros(route.send_rows - len(payload), np.int64)])
        arriving = pool.alloc_keys(route.arriving)
        moving.allocated = True
        try:
            index = io.index(np.concatenate([payload, arriving]))
            first = route.send_rows
            for k, cut in enumerate(route.cuts):
                chunk = _Chunk([], [(row, n, index[first + at: first + at + n]) for row, n, at in cut.slots])
                send_index = index[cut.send_lo: cut.send_hi]
                for state, cache in tensors:
                    cache = byte_view(cache)
                    if cut.splits is None:  # unpacked in finish, before the next layer's transfer reuses out
                        out = io.gather_buffer((state, k), (cut.recv_rows, *cache.shape[1:]), cache.dtype,
                                               layer=layer.index, state=state)
                        if out is None:
                            send = io.pack(cache, send_index)
                            out = send.new_empty((cut.recv_rows, *send.shape[1:]))
                        else:  # packed straight into this rank's slot: gathered in place
                            send = io.pack(cache, send_index, out=io.own_slot(out))
                        pending = io.all_gather(out, send, layer=layer.index, state=state)
                    else:
                        send = io.pack(cache, send_index)
                        out = send.new_empty((cut.recv_rows, *send.shape[1:]))
                        pending = io.all_to_all(out, send, cut.splits[1], cut.splits[0], layer=layer.index, state=state)
                    chunk.pendings.append((state, pending, out))
                moving.chunks.append(chunk)
        except BaseException:
            self.rollback(t)
            raise
        return t

    def _agreed(self, layer, plan: StatePlan, io: TransferContext) -> list | None:
        """Per source rank, where the pages this rank pulls from it in ``layer`` lie, or None
        where they move by collectives: no shared pools, or runs too short to pull.
        One host collective, right before the pages are allocated: every rank says where the
        pages it sends lie (a page's place in its pool is its holder's own bookkeeping) and where
        the runs of the pages it will allocate for the arriving ones end (runs of pages at a
        constant step, which one pitched copy takes), so every rank counts the copies alike and
        decides alike from them."""
        if not _pulls(layer, io):
            return None
        route = self._pull_route(plan, io.rank, io.T)
        arriving = page_pulls.arriving_breaks(layer.kv.placement(route.arriving), route.from_each, self.pitched)
        shared = io.host.all_gather_object((page_pulls.where_sent(layer.kv, route, self.pitched), arriving))
        sent = [where for where, _ in shared]
        pages = sum(int(r[:, 1].sum()) for where in sent for r in where if r is not None)
        copies = page_pulls.copies(shared)
        if not page_pulls.worth_pulling(pages, copies, layer.kv.format.kv_page_bytes, self.min_run_bytes(io.peers)):
            return None
        return page_pulls.received_places(sent, layer.index, io.rank, route)

    def _start_pulls(self, t: Transfer, plan: StatePlan, places: list, states, page: dict,
                     io: TransferContext) -> None:
        """Allocate the arriving pages; once every rank got here, pull each source's runs into
        them (the runs along which both its pages and these are consecutive); then issue, per
        state, the collective that completes once every rank's pulls did."""
        layer = t.layer
        t.data = moving = _Moving(self._pull_route(plan, io.rank, io.T), [])
        t.primitives.update({s: "pull" for s in states})  # what the layer's report says moved the pages
        route: PullRoute = moving.route
        arriving = layer.kv.alloc_keys(route.arriving)
        moving.allocated = True
        try:
            io.wait(io.rendezvous(layer=layer.index, state=KV))  # every source wrote its pages (see page_pulls)
            first = 0
            for source, (count, held) in enumerate(zip(route.from_each.tolist(), places)):
                if not count:
                    continue
                pages = page_pulls.pull_runs(held, arriving[first: first + count], self.pitched)
                first += count
                for s in states:
                    io.pull(source, page_pulls.byte_runs(pages, layer.kv.offsets[s], page[s]), layer=layer.index, state=s)
            moving.done = [io.rendezvous(layer=layer.index, state=s) for s in states]
        except BaseException:
            self.rollback(t)
            raise

    def finish(self, t: Transfer, io: TransferContext) -> None:
        moving: _Moving = t.data
        if moving.done is not None:
            for pending in moving.done:
                io.wait(pending)
            return
        caches = {KV: t.layer.kv.kv, INDEXER: t.layer.kv.indexer}
        for chunk in moving.chunks:  # unpacking chunk k overlaps chunk k+1's transfer
            for _, pending, _ in chunk.pendings:
                io.wait(pending)
            for first_row, count, pages in chunk.slots:
                for state, _, out in chunk.pendings:
                    io.unpack(byte_view(caches[state]), pages, out[first_row: first_row + count])
        moving.chunks = []  # the receive buffers go

    def min_run_bytes(self, peers) -> float:
        """The shortest average copy worth a pull: the transfer options' ``min_run_bytes`` where
        set (0: pull wherever the pools are shared), else the peer memory's own."""
        chosen = self.transfer.min_run_bytes
        return float(chosen) if chosen is not None else float(getattr(peers, "min_run_bytes", 0))

    def retire(self, t: Transfer) -> None:
        t.layer.kv.free_keys(t.data.route.freed)
        t.data.allocated = False

    def rollback(self, t: Transfer) -> None:
        moving: _Moving = t.data
        if moving.allocated:
            t.layer.kv.free_keys(moving.route.arriving)
            moving.allocated = False
        moving.chunks, moving.done = [], None


def _pulls(layer, io: TransferContext) -> bool:
    """Whether ``layer``'s pages move by pulls: the group shares its pools and this one is in it."""
    return io.peers is not None and layer.kv.offsets is not None


# ---- routes: the same cuts on every rank --------------------------------------------------------

def _parts(n: int, k: int) -> np.ndarray:
    """Offsets [k + 1] cutting ``n`` rows into ``k`` near-equal parts (the first ones longer)."""
    sizes = np.full(k, n // k, dtype=np.int64)
    sizes[: n % k] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def _build_route(plan: StatePlan, rank: int, T: int, page_bytes: int, max_chunks: int, chunk_bytes: int,
                 as_gather: bool = False) -> _Route:
    blocks = plan.rank(rank)
    freed = PageKeys.of(blocks.freed)
    if plan.primitive is Primitive.DISCARD:
        return _Route(plan.primitive, PageKeys.of(blocks.freed[:0]), 0, PageKeys.of(blocks.fetched), freed, (), 0)
    counts = plan.diff.recv[0]  # [dst, src] pages
    gather = plan.primitive is Primitive.ALL_GATHER or as_gather
    busiest = int(counts.max()) if gather else int(counts.sum(axis=0).max())
    n = int(min(max_chunks, max(1, -(-busiest * page_bytes // chunk_bytes))))
    cut = _gather_cuts if gather else _all_to_all_cuts
    sent, fetched, cuts, send_rows = cut(blocks, rank, T, n, int(counts.max()))
    empty = blocks.fetched[:0]
    return _Route(plan.primitive, PageKeys.of(np.concatenate(sent or [empty])), send_rows,
                  PageKeys.of(np.concatenate(fetched or [empty])), freed, tuple(cuts), int(counts.sum()))


def _gather_cuts(blocks, rank: int, T: int, n: int, width: int):
    """An all-gather in up to ``n`` chunks of ``width`` rows per peer: this rank's payload is the
    same for every peer. (sent, fetched, cuts, rows sent)."""
    recv_first = np.concatenate([[0], np.cumsum(blocks.recv_splits)])
    sent, fetched, cuts = [blocks.sends[(rank + 1) % T]], [], []
    bounds = _parts(width, max(1, min(n, width)))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        rows, slots = int(hi - lo), []
        for s in range(T):
            real = int(min(blocks.recv_splits[s], hi) - lo) if s != rank else 0
            if real > 0:
                slots.append((s * rows, real, sum(len(f) for f in fetched)))
                fetched.append(blocks.fetched[recv_first[s] + lo: recv_first[s] + lo + real])
        cuts.append(_Cut(int(lo), int(hi), T * rows, tuple(slots), None))
    return sent, fetched, cuts, width


def _all_to_all_cuts(blocks, rank: int, T: int, n: int, width: int):
    """An all-to-all in ``n`` chunks, each peer's rows cut into near-equal parts. (sent, fetched,
    cuts, rows sent)."""
    recv_first = np.concatenate([[0], np.cumsum(blocks.recv_splits)])
    send_cuts = [_parts(int(c), n) for c in blocks.send_splits]
    recv_cuts = [_parts(int(c), n) for c in blocks.recv_splits]
    sent, fetched, cuts, done = [], [], [], 0
    for k in range(n):
        send_splits = [int(c[k + 1] - c[k]) for c in send_cuts]
        recv_splits = [int(c[k + 1] - c[k]) for c in recv_cuts]
        sent += [peer[c[k]: c[k + 1]] for peer, c in zip(blocks.sends, send_cuts)]
        at = sum(len(f) for f in fetched)
        fetched += [blocks.fetched[recv_first[s] + c[k]: recv_first[s] + c[k + 1]] for s, c in enumerate(recv_cuts)]
        rows = sum(recv_splits)
        cuts.append(_Cut(done, done + sum(send_splits), rows, ((0, rows, at),) if rows else (),
                         (send_splits, recv_splits)))
        done += sum(send_splits)
    return sent, fetched, cuts, done
