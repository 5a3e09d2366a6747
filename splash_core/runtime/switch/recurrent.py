"""Moving a KDA layer's per-request recurrent state (delta-rule state and short-conv cache).

Keys are the manifest's ``(request_id, shard)``: shard s is heads ``head_shard(H, s, T)`` of a
request's state, ``recurrent_bytes_per_request_layer / T`` bytes. TP holds shard r of every
request on rank r; DP, DOP and CP hold every shard on the request's owner
(:func:`~splash_core.runtime.recurrent_pool.held_heads`). Hence:

- TP → DP/DOP/CP: an all-to-all; each owner receives the other T − 1 shards of its requests and
  joins them with its own, every other rank frees its shard.
- DP/DOP/CP → TP: an all-to-all; each owner sends shard s of its requests to rank s and keeps
  only its own shard.
- between DP, DOP and CP, and TP → TP: nothing moves (the owner keeps the whole state).

``start`` packs the shards of ``sends`` (every peer's keys, in peer order) into one uint8 buffer
(one pack call per run of a request's keys) and issues the all-to-all with the plan's splits.
``finish`` waits, builds each changing request's destination state in fresh tensors from its
kept and received shards, and installs it, holding on to the source state; ``retire`` lets the
source go, ``rollback`` puts it back. What depends only on the plan (the runs to pack, the
splits, each changing request's shards and received rows) is worked out once per plan
(:meth:`RecurrentMover.prepare`) and shared by the layers. Only requests with a history are
planned (a request in its first step has no state to move: every KDA layer admits it in the
layout it computes in).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Mapping

import torch

from ...layouts import Layout, Primitive, State
from ...planning.manifest import RankBlocks, StatePlan
from ..recurrent_pool import RequestState
from .transfer import Pending, Transfer, TransferContext

RECURRENT = State.RECURRENT


@dataclasses.dataclass(frozen=True)
class _Route:
    """What this rank executes for one recurrent plan in every layer of its kind."""

    packs: tuple[tuple[int, list[int]], ...]  # (request, shards): consecutive keys of ``sends``
    send_splits: list[int]
    recv_splits: list[int]
    fetched: int  # rows received
    changing: tuple[tuple[int, list[int], dict[int, int]], ...]  # (request, shards after, shard -> row)


@dataclasses.dataclass
class _Moving:
    route: _Route
    pending: Pending | None = None
    recv: torch.Tensor | None = None  # [fetched, shard bytes] uint8, rows in ``fetched`` order
    replaced: dict[int, RequestState | None] | None = None  # source state of each changed request


class RecurrentMover:
    """:class:`~splash_core.runtime.switch.transfer.StateMover` for ``State.RECURRENT``."""

    states = (RECURRENT,)

    def __init__(self):
        self._routes: weakref.WeakKeyDictionary[StatePlan, dict] = weakref.WeakKeyDictionary()

    def prepare(self, layer, plans: Mapping[State, StatePlan], rank: int, T: int, io=None) -> None:
        """Work out the route of ``plans`` for this rank now (planning time)."""
        self._route(plans[RECURRENT], rank)

    def _route(self, plan: StatePlan, rank: int) -> _Route:
        known = self._routes.setdefault(plan, {})
        if rank not in known:
            known[rank] = _build_route(plan.rank(rank))
        return known[rank]

    def start(self, layer, plans: Mapping[State, StatePlan], dst: Layout, io: TransferContext) -> Transfer:
        plan, pool = plans[RECURRENT], layer.state
        shard_bytes = pool.format.shard_bytes(io.T)
        if int(plan.block_bytes[0]) != shard_bytes:
            raise ValueError(f"layer {layer.index}: the plan moves recurrent shards of {int(plan.block_bytes[0])} "
                             f"bytes, the pool's are {shard_bytes}")
        route = self._route(plan, io.rank)
        t = Transfer(layer, self.states, {RECURRENT: plan.primitive.value},
                     {RECURRENT: int(plan.fetched_bytes[io.rank])}, {RECURRENT: int(plan.fetched_bytes.sum())})
        moving = t.data = _Moving(route)
        if plan.primitive is Primitive.DISCARD:
            return t
        rows = [pool.pack_shards(rid, shards, io.T) for rid, shards in route.packs]
        send = torch.cat(rows) if rows else torch.empty(0, shard_bytes, dtype=torch.uint8, device=io.device)
        moving.recv = send.new_empty(route.fetched, shard_bytes)
        moving.pending = io.all_to_all(moving.recv, send, route.recv_splits, route.send_splits,
                                       layer=layer.index, state=RECURRENT)
        return t

    def finish(self, t: Transfer, io: TransferContext) -> None:
        moving, pool = t.data, t.layer.state
        if moving.pending is not None:
            io.wait(moving.pending)
        recv = moving.recv
        # build every destination state first: a failure here leaves the layer untouched
        new = {rid: pool.assemble(rid, shards, io.T, {s: recv[i] for s, i in rows.items()})
               for rid, shards, rows in moving.route.changing}
        moving.replaced = {rid: pool.put(rid, part) for rid, part in new.items()}
        moving.recv = None

    def retire(self, t: Transfer) -> None:
        t.data.replaced = None  # the source states go with the last reference to them

    def rollback(self, t: Transfer) -> None:
        moving, pool = t.data, t.layer.state
        for rid, part in (moving.replaced or {}).items():
            pool.put(rid, part)
        moving.replaced = moving.recv = None


def _build_route(b: RankBlocks) -> _Route:
    packs: list[tuple[int, list[int]]] = []
    for peer in b.sends:
        for rid, s in peer.tolist():
            if packs and packs[-1][0] == rid:
                packs[-1][1].append(s)
            else:
                packs.append((rid, [s]))
    shards: dict[int, list[int]] = {}
    received: dict[int, dict[int, int]] = {}
    for rid, s in b.kept.tolist():
        shards.setdefault(rid, []).append(s)
    for i, (rid, s) in enumerate(b.fetched.tolist()):
        shards.setdefault(rid, []).append(s)
        received.setdefault(rid, {})[s] = i
    changing = sorted(set(received) | {rid for rid, _ in b.freed.tolist()})
    return _Route(tuple(packs), [int(n) for n in b.send_splits], [int(n) for n in b.recv_splits], len(b.fetched),
                  tuple((rid, shards.get(rid, []), received.get(rid, {})) for rid in changing))
