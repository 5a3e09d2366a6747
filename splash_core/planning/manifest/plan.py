"""The switch manifest (paper §2 Eq 2–3, §4.1, Eq 5): for every layer, state and rank, the
blocks kept, freed and fetched, the primitive, the send/receive splits and the bytes.

Every layer of one kind has the same plan (the same weights shards, pages and recurrent
shards, only the layer index differs), so :func:`plan_switch` plans each kind once and its
:class:`LayerPlan` objects share those :class:`StatePlan` objects; an MLA layer that stores no
indexer keys (GLM-5's shared-indexer layers) has its kind's plans less the indexer one.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import numpy as np

from ...layouts import Layout, Primitive, State
from ...profiles.model import LayerKind, ModelProfile
from ...profiles.projections import check_divides, projections
from ..ownership import Batch, Footprint, check_batch, footprint, layer_indices
from . import universe as U
from .diff import BlockDiff, RankBlocks
from .fit import Fit, eq5_fit, layer_sweep, switch_peak


@dataclasses.dataclass(frozen=True, eq=False)
class StatePlan:
    """One state of one layer kind: what every rank keeps, frees, fetches and sends.

    Byte arrays are [T] (per rank) or [T, T]; ``recv_matrix[dst, src]`` is what ``dst``
    receives from ``src``, ``send_matrix = recv_matrix.T``. Keys of :meth:`rank` are
    ``(request_id, page)`` for kv and indexer, ``(request_id, shard)`` for recurrent and
    ``(matrix index into matrices, shard)`` for weights.
    """

    state: State
    kind: LayerKind
    primitive: Primitive
    matrices: tuple[str, ...]  # weights: projection name of each matrix index; else ()
    block_bytes: np.ndarray  # [classes]: bytes of one block of each size class
    kept_bytes: np.ndarray
    freed_bytes: np.ndarray
    recv_matrix: np.ndarray
    diff: BlockDiff

    @property
    def send_matrix(self) -> np.ndarray:
        return self.recv_matrix.T

    @property
    def fetched_bytes(self) -> np.ndarray:
        """Bytes each rank receives: Eq 2 (kv, indexer, recurrent) and Eq 3 (weights)."""
        return self.recv_matrix.sum(axis=1)

    @property
    def sent_bytes(self) -> np.ndarray:
        return self.recv_matrix.sum(axis=0)

    @property
    def source_bytes(self) -> np.ndarray:
        """What each rank holds before the switch."""
        return self.kept_bytes + self.freed_bytes

    @property
    def dest_bytes(self) -> np.ndarray:
        """What each rank holds after it."""
        return self.kept_bytes + self.fetched_bytes

    @property
    def send_buffer_bytes(self) -> np.ndarray:
        """Each rank's packed send buffer: one payload every peer receives for an
        all-gather, a slice per peer for an all-to-all."""
        if self.primitive is Primitive.ALL_GATHER:
            return self.send_matrix.max(axis=1)
        return self.sent_bytes

    @property
    def transit_bytes(self) -> np.ndarray:
        """Receive plus send buffers of each rank while this layer's state is in flight."""
        return self.fetched_bytes + self.send_buffer_bytes

    def rank(self, r: int) -> RankBlocks:
        """Explicit key arrays rank ``r`` executes (cached)."""
        return self.diff.rank(r)


@dataclasses.dataclass(frozen=True, eq=False)
class LayerPlan:
    """The plan of one layer: one :class:`StatePlan` per state the layer has."""

    index: int
    kind: LayerKind
    states: Mapping[State, StatePlan]

    @property
    def source_bytes(self) -> np.ndarray:
        return sum(p.source_bytes for p in self.states.values())

    @property
    def dest_bytes(self) -> np.ndarray:
        return sum(p.dest_bytes for p in self.states.values())

    @property
    def transit_bytes(self) -> np.ndarray:
        return sum(p.transit_bytes for p in self.states.values())


@dataclasses.dataclass(frozen=True, eq=False)
class Manifest:
    """The plan of one switch ``src → dst`` for a batch, over the planned layers."""

    src: Layout
    dst: Layout
    T: int
    page_size: int
    model: str
    layers: tuple[LayerPlan, ...]
    source: Footprint  # M_r(a) over the planned layers
    dest: Footprint  # M_r(b)

    def layer(self, index: int) -> LayerPlan:
        """The plan of model layer ``index`` (KeyError if it was not planned)."""
        for layer in self.layers:
            if layer.index == index:
                return layer
        raise KeyError(f"layer {index} is not in this manifest")

    def classes(self) -> tuple[LayerPlan, ...]:
        """One layer plan per distinct set of state plans, in layer order: one per layer kind, and
        one more for MLA layers storing no indexer keys (they share their kind's other plans)."""
        out: dict[int, LayerPlan] = {}
        for layer in self.layers:
            out.setdefault(id(layer.states), layer)
        return tuple(out.values())

    def state_plans(self) -> list[tuple[StatePlan, int]]:
        """Each distinct state plan with the number of planned layers that have it."""
        out: dict[int, list] = {}
        for layer in self.layers:
            for plan in layer.states.values():
                out.setdefault(id(plan), [plan, 0])[1] += 1
        return [(plan, n) for plan, n in out.values()]

    def fetched_bytes(self, state: State | None = None) -> np.ndarray:
        """Bytes each rank receives over all planned layers (one state, or all)."""
        out = np.zeros(self.T, dtype=np.int64)
        for plan, n in self.state_plans():
            if state is None or plan.state is state:
                out += n * plan.fetched_bytes
        return out

    @property
    def delta_layer(self) -> np.ndarray:
        """Δ_layer_r of Eq 5: the largest one-layer receive + send buffers of each rank."""
        transit = [layer.transit_bytes for layer in self.classes()]
        return np.max(transit, axis=0) if transit else np.zeros(self.T, dtype=np.int64)

    @property
    def eq5_peak(self) -> np.ndarray:
        """max(M_r(a), M_r(b)) + Δ_layer_r (Eq 5 without the reserve), per rank."""
        return np.maximum(self.source.total, self.dest.total) + self.delta_layer

    @property
    def sweep_peak(self) -> np.ndarray:
        """The layer-by-layer peak (:func:`~.fit.layer_sweep`): equal to :attr:`eq5_peak` or below
        when all layers are alike; a hybrid stack whose kinds grow in opposite directions can
        exceed Eq 5, which is why :attr:`peak` takes both."""
        if not self.layers:
            return np.zeros(self.T, dtype=np.int64)
        return layer_sweep(*self._layer_bytes())

    @property
    def peak(self) -> np.ndarray:
        """Per rank, the most attention state held at any point of the switch (Eq 5 and the
        layer-by-layer sweep: :func:`~.fit.switch_peak`)."""
        if not self.layers:
            return self.eq5_peak
        return switch_peak(*self._layer_bytes())

    def _layer_bytes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[L, T] bytes each planned layer holds before, after and in flight."""
        return tuple(np.stack([getattr(layer, f) for layer in self.layers])
                     for f in ("source_bytes", "dest_bytes", "transit_bytes"))

    def fits(self, budget_bytes: float, reserve_bytes: float = 0.0) -> Fit:
        """Whether every rank stays within ``budget_bytes`` (H_r less state outside
        attention) with ``reserve_bytes`` (R_r) kept free, during the whole switch (Eq 5)."""
        return eq5_fit(self.peak, budget_bytes, reserve_bytes)

    def summary(self) -> list[dict]:
        """One row per (layer kind, state): primitive and bytes, per layer and over the layers
        that have the state."""
        rows = []
        for plan, n in self.state_plans():
            rows.append({
                "kind": plan.kind, "state": plan.state, "primitive": plan.primitive, "layers": n,
                "fetched_per_layer": plan.fetched_bytes, "freed_per_layer": plan.freed_bytes,
                "kept_per_layer": plan.kept_bytes, "fetched_total": n * plan.fetched_bytes,
                "group_total": int(n * plan.fetched_bytes.sum()),
            })
        return rows


def plan_switch(src: Layout, dst: Layout, batch: Batch, model: ModelProfile, T: int,
                page_size: int, *, layers: Iterable[int] | None = None, copied: np.ndarray | None = None) -> Manifest:
    """Plan the switch ``src → dst`` of ``batch`` over ``layers`` (default: all).

    ``copied``: per request of ``batch`` (in order), how many of its leading pages a pre-copy
    (:func:`plan_precopy`) already placed on their destination holders; those count as held
    there, so the switch keeps them and moves only the rest (the dirty tail).

    ValueError for a T that does not divide a layer kind's heads, owners outside the group,
    duplicate request ids or a T the planner cannot address (> 64).
    """
    src, dst = Layout(src), Layout(dst)
    check_batch(batch, T)
    U.mask_dtype(T)
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1 (got {page_size})")
    selected = layer_indices(model, layers)
    ids, owners, contexts = batch.ids, batch.owners, batch.contexts
    per_kind: dict[LayerKind, dict[State, StatePlan]] = {}
    kinds = model.layer_kinds
    for kind in sorted({kinds[i] for i in selected}, key=lambda k: k.value):
        per_kind[kind] = _plan_kind(kind, src, dst, ids, owners, contexts, model, T, page_size, copied)
    return Manifest(src, dst, T, page_size, model.name, _layer_plans(model, selected, per_kind),
                    footprint(src, batch, model, T, page_size, layers=selected),
                    footprint(dst, batch, model, T, page_size, layers=selected))


def _layer_plans(model: ModelProfile, selected, per_kind) -> tuple[LayerPlan, ...]:
    """Each selected layer's plan: its kind's state plans, less the indexer plan where an MLA layer
    stores no indexer keys (those layers share one mapping, as the layers of a kind do)."""
    keyless = {kind: {s: p for s, p in plans.items() if s is not State.INDEXER} for kind, plans in per_kind.items()}
    kinds = model.layer_kinds
    keeps_all = [kinds[i] is not LayerKind.MLA or model.stores_indexer_keys(i) for i in selected]
    return tuple(LayerPlan(i, kinds[i], (per_kind if whole else keyless)[kinds[i]])
                 for i, whole in zip(selected, keeps_all))


def plan_precopy(src: Layout, dst: Layout, batch: Batch, model: ModelProfile, T: int, page_size: int,
                 pages: np.ndarray) -> dict[State, StatePlan]:
    """The pre-copy of a switch ``src → dst``: per request of ``batch`` (in order) its first
    ``pages[i]`` pages (full, so never written again) fetched by every destination holder that
    lacks them, nothing freed (the source layout keeps serving). The KV (and indexer) plans of the
    MLA layers, shared by all of them; empty where the model has none."""
    if LayerKind.MLA not in model.layer_kinds:
        return {}
    check_batch(batch, T)
    u = U.page_universe(batch.ids, np.asarray(pages, dtype=np.int64) * page_size, page_size)
    held = U.page_masks(src, u, batch.ids, batch.owners, T)
    diff = BlockDiff(u, held, held | U.page_masks(dst, u, batch.ids, batch.owners, T), T)
    return _page_plans(LayerKind.MLA, diff, model, page_size)


def layer_states(model: ModelProfile, layer: int, states: Mapping[State, StatePlan]) -> dict[State, StatePlan]:
    """``states`` (plans of ``layer``'s kind) less the indexer plan where ``layer`` stores no
    indexer keys (GLM-5's shared-indexer layers)."""
    return {s: p for s, p in states.items() if s is not State.INDEXER or model.stores_indexer_keys(layer)}


def _page_plans(kind, diff: BlockDiff, model, page_size) -> dict[State, StatePlan]:
    """KV and indexer plans of one page diff (same pages, same holders: the diff is shared)."""
    states = {State.KV: _state_plan(State.KV, kind, diff, [page_size * model.kv_bytes_per_token_layer])}
    if model.indexer is not None:
        states[State.INDEXER] = _state_plan(State.INDEXER, kind, diff, [page_size * model.indexer_bytes_per_token_layer])
    return states


def _plan_kind(kind, src, dst, ids, owners, contexts, model, T, page_size, copied=None) -> dict[State, StatePlan]:
    states: dict[State, StatePlan] = {}
    projs = projections(model, kind)
    if projs:
        check_divides(T, projs[0].heads, f"{kind} heads")
        u = U.shard_universe(np.arange(len(projs), dtype=np.int64), T, sized_by_first=True)
        diff = BlockDiff(u, U.weight_masks(src, u, T), U.weight_masks(dst, u, T), T)
        sizes = [p.shard_bytes(T) for p in projs]
        states[State.WEIGHTS] = _state_plan(State.WEIGHTS, kind, diff, sizes, tuple(p.name for p in projs))
    if kind is LayerKind.MLA:
        u = U.page_universe(ids, contexts, page_size)
        held, needed = U.page_masks(src, u, ids, owners, T), U.page_masks(dst, u, ids, owners, T)
        if copied is not None:  # pre-copied pages are held by their destination holders too
            held = held | np.where(u.page < np.asarray(copied)[u.request_index], needed, 0).astype(held.dtype)
        states.update(_page_plans(kind, BlockDiff(u, held, needed, T), model, page_size))
    elif kind is LayerKind.KDA:
        check_divides(T, model.kda.heads, "kda heads")
        started = contexts > 0  # no history, no state yet: nothing to move
        u = U.shard_universe(ids[started], T, sized_by_first=False)
        held = owners[started]
        diff = BlockDiff(u, U.recurrent_masks(src, u, held, T), U.recurrent_masks(dst, u, held, T), T)
        states[State.RECURRENT] = _state_plan(State.RECURRENT, kind, diff,
                                              [model.recurrent_bytes_per_request_layer // T])
    return states


def _state_plan(state, kind, diff: BlockDiff, sizes, matrices=()) -> StatePlan:
    sizes = np.asarray(sizes, dtype=np.int64)
    if not diff.fetched_anywhere:
        primitive = Primitive.DISCARD
    elif diff.lands_everywhere:
        primitive = Primitive.ALL_GATHER
    else:
        primitive = Primitive.ALL_TO_ALL
    return StatePlan(
        state=state, kind=kind, primitive=primitive, matrices=tuple(matrices), block_bytes=sizes,
        kept_bytes=sizes @ diff.kept, freed_bytes=sizes @ diff.freed,
        recv_matrix=np.tensordot(sizes, diff.recv, axes=1), diff=diff,
    )
