"""The exact blocks each rank holds in each layout, enumerated one by one.

Block ids (tuples, hashable, comparable across layouts):

- ``(layer, matrix, shard)``: head shard ``shard`` of projection ``matrix`` of ``layer``
  (MLA ``q_b``, ``kv_b``, ``o``; KDA ``q``, ``k``, ``v``, ``o``, ``beta``, ``f_b``, ``g_b``,
  ``conv``, ``decay``; see :mod:`splash_core.planning.weight_bytes`);
- ``(layer, "kv", request_id, page)`` and ``(layer, "indexer", request_id, page)``: page
  ``page`` of a request's latent / indexer history, covering positions
  ``[page * P, min((page + 1) * P, context))`` (:func:`page_positions`);
- ``(layer, "recurrent", request_id, shard)``: head shard ``shard`` of a request's KDA state.

Placement follows the rules in :mod:`splash_core.planning.ownership` word for word. This module is
written for clarity, not speed: tests and small cases use it as the oracle the vectorised
planner (:mod:`splash_core.planning.manifest`) is checked against.
"""

from __future__ import annotations

from typing import Iterable

from splash_core.layouts import Layout, Ownership, Placement, State
from splash_core.planning.ownership import Batch, check_batch, cp_rank_of_page, layer_indices, pages_for
from splash_core.profiles.model import LayerKind, ModelProfile
from splash_core.profiles.projections import check_divides, projections

BlockId = tuple


def state_of(block: BlockId) -> State:
    """Which state a block id belongs to."""
    if len(block) == 3:
        return State.WEIGHTS
    return State(block[1])


def page_positions(page: int, context: int, page_size: int) -> range:
    """Positions of a request's history that page ``page`` covers."""
    return range(page * page_size, min((page + 1) * page_size, context))


def _holds_page(layout: Layout, rank: int, request_id: int, owner: int, page: int, T: int) -> bool:
    if layout.ownership is Ownership.ALL:
        return True
    if layout.ownership is Ownership.OWNER:
        return owner == rank
    return cp_rank_of_page(request_id, page, T) == rank


def rank_blocks(layout: Layout, batch: Batch, model: ModelProfile, T: int, page_size: int,
                rank: int, *, layers: Iterable[int] | None = None) -> set[BlockId]:
    """Every block ``rank`` holds in ``layout``."""
    check_batch(batch, T)
    out: set[BlockId] = set()
    for layer in layer_indices(model, layers):
        kind = model.layer_kinds[layer]
        projs = projections(model, kind)
        if projs:
            check_divides(T, projs[0].heads, f"{kind} heads")
        shards = [rank] if layout.placement is Placement.SHARDED else range(T)
        out.update((layer, p.name, s) for p in projs for s in shards)
        for req in batch.requests:
            if kind is LayerKind.MLA:
                for page in range(int(pages_for(req.context, page_size))):
                    if _holds_page(layout, rank, req.id, req.owner, page, T):
                        out.add((layer, "kv", req.id, page))
                        if model.indexer is not None:
                            out.add((layer, "indexer", req.id, page))
            elif kind is LayerKind.KDA and req.context > 0:  # state exists once there is a history
                if layout is Layout.TP:
                    out.add((layer, "recurrent", req.id, rank))
                elif req.owner == rank:
                    out.update((layer, "recurrent", req.id, s) for s in range(T))
    return out


def block_sets(layout: Layout, batch: Batch, model: ModelProfile, T: int, page_size: int, *,
               layers: Iterable[int] | None = None) -> list[set[BlockId]]:
    """:func:`rank_blocks` for every rank, in rank order."""
    return [rank_blocks(layout, batch, model, T, page_size, r, layers=layers) for r in range(T)]


def block_bytes(block: BlockId, model: ModelProfile, T: int, page_size: int) -> int:
    """Bytes one block occupies and moves: a whole page (the pool's unit) for KV and
    indexer, 1/T of a projection or of a request's recurrent state for shards."""
    state = state_of(block)
    if state is State.WEIGHTS:
        layer, matrix, _ = block
        proj = {p.name: p for p in projections(model, model.layer_kinds[layer])}[matrix]
        return proj.shard_bytes(T)
    if state is State.KV:
        return page_size * model.kv_bytes_per_token_layer
    if state is State.INDEXER:
        return page_size * model.indexer_bytes_per_token_layer
    check_divides(T, model.kda.heads, "kda heads")
    return model.recurrent_bytes_per_request_layer // T
