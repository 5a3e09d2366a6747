"""Moving a layer's KV pages (and the indexer keys stored in the same pages) between ownerships.

Per layer and rank, from the manifest's :class:`~splash_core.manifest.RankBlocks` of the KV
state (keys ``(request_id, page)``; the indexer state has the same blocks):

- send: the physical pages of every key in ``sends[q]`` for all peers q, in peer order, are
  looked up once; pages for ``fetched`` are allocated per request in the layer's pool (its block
  tables) at the same time, so this host bookkeeping overlaps the previous layer's computation
  (the layer does not compute before landing, so nothing reads them early).
- the pages travel in a few chunks (the same on every rank, from the plan): each chunk is
  packed into one contiguous buffer by one kernel call per page tensor (``MLAKernels.pack``)
  and sent by one collective, so packing chunk k+1 and unpacking chunk k−1 overlap chunk k's
  transfer. All-to-all: every peer's slice is split alike (``send_splits``/``recv_splits``
  per chunk). All-gather (into TP, where every rank sends all it holds to everyone): each
  rank's payload is padded to the largest one (padding rows repeat page 0, ignored on arrival)
  and cut into the same row ranges.
- land (``finish``): per chunk, wait for its collectives, then one ``unpack`` per source slot
  (one for an all-to-all) writes the pages. They are the destination's new pages, which nothing
  reads before the layer lands, so a later chunk's failure only needs them freed.
- retire: the ``freed`` pages go back to the free list; rollback frees the allocated ones.
- discard: nothing moves; retire frees ``freed``.

The step's new tokens never move: the executor reserves their pages in the destination layout.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
import torch

from ...layouts import Layout, Primitive, State
from ...manifest import StatePlan
from .transfer import Pending, Transfer, TransferContext, byte_view

KV, INDEXER = State.KV, State.INDEXER
CHUNK_BYTES = 64 << 20  # per collective: large enough for full link bandwidth
MAX_CHUNKS = 8


@dataclasses.dataclass
class _Chunk:
    pendings: list[tuple[State, Pending, torch.Tensor]]  # per page tensor: its collective and receive buffer
    slots: list[tuple[int, int, torch.Tensor]]  # per source: (first row in the receive buffers, rows, pages)


@dataclasses.dataclass
class _Moving:
    blocks: object  # RankBlocks of the KV state
    primitive: Primitive
    chunks: list[_Chunk]
    allocated: bool = False  # pages were given to ``fetched`` (until retire or rollback)


class PagesMover:
    """:class:`~splash_core.runtime.switch.transfer.StateMover` for ``State.KV`` and ``State.INDEXER``."""

    states = (KV, INDEXER)

    def start(self, layer, plans: Mapping[State, StatePlan], dst: Layout, io: TransferContext) -> Transfer:
        plan, pool = plans[KV], layer.kv
        blocks = plan.rank(io.rank)
        tensors = [(KV, pool.kv)] + ([(INDEXER, pool.indexer)] if pool.indexer is not None else [])
        if (INDEXER in plans) != (pool.indexer is not None):
            raise ValueError(f"layer {layer.index}: the plan and the pool disagree on indexer keys")
        t = Transfer(layer, tuple(s for s, _ in tensors), {s: str(plan.primitive) for s, _ in tensors},
                     {s: 0 for s, _ in tensors}, {s: 0 for s, _ in tensors})
        t.data = moving = _Moving(blocks, plan.primitive, [])
        if plan.primitive is Primitive.DISCARD:
            return t
        counts = plan.diff.recv[0]  # [dst, src] pages
        page_bytes = {s: cache[0].numel() * cache.element_size() for s, cache in tensors}
        for state in page_bytes:
            t.received_bytes[state] = len(blocks.fetched) * page_bytes[state]
            t.group_bytes[state] = int(counts.sum()) * page_bytes[state]
        gather = plan.primitive is Primitive.ALL_GATHER
        if gather:  # this rank's payload is the same for every peer
            width = int(counts.max())
            payload = np.zeros(width, dtype=np.int64)  # padding rows pack page 0
            mine = blocks.sends[(io.rank + 1) % io.T]
            payload[: len(mine)] = physical_pages(pool, mine)
            busiest = width
        else:
            payload = physical_pages(pool, np.concatenate(blocks.sends))
            busiest = int(counts.sum(axis=0).max())
        n = int(min(MAX_CHUNKS, max(1, -(-busiest * sum(page_bytes.values()) // CHUNK_BYTES))))
        arriving = allocate(pool, blocks.fetched)
        moving.allocated = True
        try:
            cuts = _gather_chunks(blocks, width, n, io) if gather else _exchange_chunks(blocks, n, io)
            for send_rows, slots, splits in cuts:
                chunk = _Chunk([], [(row, count, io.index(arriving[keys])) for row, count, keys in slots])
                index = io.index(payload[send_rows])
                for state, cache in tensors:
                    send = io.kernels.pack(byte_view(cache), index)
                    if gather:
                        out = send.new_empty((io.T * send.shape[0], *send.shape[1:]))
                        pending = io.all_gather(out, send, layer=layer.index, state=state)
                    else:
                        out = send.new_empty((int(sum(splits[1])), *send.shape[1:]))
                        pending = io.all_to_all(out, send, splits[1], splits[0], layer=layer.index, state=state)
                    chunk.pendings.append((state, pending, out))
                moving.chunks.append(chunk)
        except BaseException:
            self.rollback(t)
            raise
        return t

    def finish(self, t: Transfer, io: TransferContext) -> None:
        moving: _Moving = t.data
        caches = {KV: t.layer.kv.kv, INDEXER: t.layer.kv.indexer}
        for chunk in moving.chunks:  # unpacking chunk k overlaps chunk k+1's transfer
            for _, pending, _ in chunk.pendings:
                io.wait(pending)
            for first_row, count, pages in chunk.slots:
                for state, _, out in chunk.pendings:
                    io.kernels.unpack(byte_view(caches[state]), pages, out[first_row: first_row + count])
        moving.chunks = []  # the receive buffers go

    def retire(self, t: Transfer) -> None:
        free(t.layer.kv, t.data.blocks.freed)
        t.data.allocated = False

    def rollback(self, t: Transfer) -> None:
        moving: _Moving = t.data
        if moving.allocated:
            free(t.layer.kv, moving.blocks.fetched)
            moving.allocated = False
        moving.chunks = []


# ---- chunking: the same cuts on every rank ----------------------------------------------------

def _parts(n: int, k: int) -> np.ndarray:
    """Offsets [k + 1] cutting ``n`` rows into ``k`` near-equal parts (the first ones longer)."""
    sizes = np.full(k, n // k, dtype=np.int64)
    sizes[: n % k] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def _exchange_chunks(blocks, n: int, io: TransferContext):
    """Per chunk of an all-to-all: (rows of the send payload, unpack slots, (send splits, recv
    splits)). Peer q's slice and source s's rows are each cut in ``n`` parts alike on both sides."""
    send_first = np.concatenate([[0], np.cumsum(blocks.send_splits)])
    recv_first = np.concatenate([[0], np.cumsum(blocks.recv_splits)])
    send_cuts = [_parts(int(c), n) for c in blocks.send_splits]
    recv_cuts = [_parts(int(c), n) for c in blocks.recv_splits]
    for k in range(n):
        rows = np.concatenate([np.arange(send_first[q] + c[k], send_first[q] + c[k + 1]) for q, c in enumerate(send_cuts)])
        keys = np.concatenate([np.arange(recv_first[s] + c[k], recv_first[s] + c[k + 1]) for s, c in enumerate(recv_cuts)])
        splits = ([int(c[k + 1] - c[k]) for c in send_cuts], [int(c[k + 1] - c[k]) for c in recv_cuts])
        yield rows.astype(np.int64), [(0, len(keys), keys.astype(np.int64))], splits


def _gather_chunks(blocks, width: int, n: int, io: TransferContext):
    """Per chunk of an all-gather: (rows of the padded payload, unpack slots per source, None).
    Every rank's payload is cut into the same row ranges; source s's real rows in a range are
    those below its count."""
    cuts = _parts(width, max(1, min(n, width)))
    recv_first = np.concatenate([[0], np.cumsum(blocks.recv_splits)])
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        slots = []
        for s in range(io.T):
            real = int(min(blocks.recv_splits[s], hi) - lo) if s != io.rank else 0
            if real > 0:
                slots.append((s * int(hi - lo), real, np.arange(recv_first[s] + lo, recv_first[s] + lo + real)))
        yield np.arange(lo, hi), slots, None


# ---- block-table bookkeeping: one call per request, never per page -----------------------

def _by_request(keys: np.ndarray):
    """(request id, positions into ``keys``) for each request among ``keys`` [n, 2]."""
    if not len(keys):
        return
    order = np.argsort(keys[:, 0], kind="stable")
    ids, starts = np.unique(keys[order, 0], return_index=True)
    for rid, lo, hi in zip(ids, starts, list(starts[1:]) + [len(order)]):
        yield int(rid), order[lo:hi]


def physical_pages(pool, keys: np.ndarray) -> np.ndarray:
    """Physical pages of ``keys`` [n, 2] (request, logical page) in this layer's pool, in order."""
    out = np.empty(len(keys), dtype=np.int64)
    for rid, where in _by_request(keys):
        logical, physical = pool.pages_of(rid)
        table = np.full(int(logical.max(initial=-1)) + 1, -1, dtype=np.int64)
        table[logical] = physical
        wanted = keys[where, 1]
        if wanted.max() >= table.size or (table[wanted] < 0).any():
            raise RuntimeError(f"layer {pool.layer}: the plan sends pages of request {rid} this rank does not hold")
        out[where] = table[wanted]
    return out


def allocate(pool, keys: np.ndarray) -> np.ndarray:
    """Allocate ``keys`` [n, 2] in the pool (all or none); their physical pages, in order."""
    if len(keys) > pool.free_pages:
        raise RuntimeError(f"layer {pool.layer}: {len(keys)} pages arrive, {pool.free_pages} are free")
    out = np.empty(len(keys), dtype=np.int64)
    done = []
    try:
        for rid, where in _by_request(keys):
            out[where] = pool.alloc(rid, keys[where, 1])
            done.append((rid, keys[where, 1]))
    except BaseException:
        for rid, pages in done:
            pool.free(rid, pages)
        raise
    return out


def free(pool, keys: np.ndarray) -> None:
    for rid, where in _by_request(keys):
        pool.free(rid, keys[where, 1])
