"""From a model's current per-layer layouts and a step's batch to the manifests a switch executes,
and the checks that must pass before anything moves (paper §4.1 step 4, Eq 5).

What moves is each request's history *before* the step (``start`` tokens): the step's own rows
are written straight into the destination layout, so a request in its first prefill chunk
(``start == 0``) has nothing to move, and a request that finished before the step is not in
the batch (its pages must have been released). The one exception is a layer that computes the
switching step in its source layout and moves after it (the executor's ``defer_first``): it
moves its history *after* the step (``after_step``), the step's rows included.

The checks gather their numbers over host collectives, so they never wait for the device.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ...layouts import Layout, Ownership, State
from ...planning import ownership
from ...planning.manifest import LayerPlan, Manifest, plan_switch, switch_peak
from ..step_batch import StepBatch
from .modes import Mode


@dataclasses.dataclass(frozen=True, eq=False)
class SwitchPlan:
    """One switching step as every rank executes it, planned once (on rank 0 in a serving group,
    which broadcasts it with the step: no other rank plans or checks Eq 5 again).

    ``manifests``: one per source layout among the moving layers, of the histories before the
    step (a partial handoff's layers that hold no copies apart: :func:`plan_layers`); ``deferred``: the model position of the layer that computes the step in its source
    layout and moves after it, with ``deferred_manifests`` of its histories after the step;
    ``refusal``: why Eq 5 refused the switch (nothing may move), or None. ``layouts`` and
    ``batch_key`` say which model state and batch it was planned for (:meth:`matches`)."""

    dst: Layout
    mode: Mode
    layouts: tuple[Layout, ...]
    batch_key: tuple
    manifests: dict[Layout, Manifest]
    deferred: int | None = None
    deferred_manifests: dict[Layout, Manifest] | None = None
    plan_ms: float = 0.0
    refusal: str | None = None
    copied: np.ndarray | None = None  # per request, the leading pages a pre-copy placed (the handoff's)
    copied_layers: tuple[int, ...] | None = None  # the layers it placed them in (None: every moving layer)

    @staticmethod
    def key_of(batch: StepBatch) -> tuple:
        return (batch.T, batch.page_size, batch.ids.tobytes(), batch.owners.tobytes(), batch.starts.tobytes(),
                batch.rows.tobytes())

    def matches(self, layouts, batch: StepBatch) -> str | None:
        """Why this plan is not the one for layer layouts ``layouts`` and ``batch``, or None."""
        if tuple(layouts) != self.layouts:
            return f"planned for layer layouts {[str(l) for l in self.layouts]}, the model has {[str(l) for l in layouts]}"
        if self.key_of(batch) != self.batch_key:
            return "planned for another batch"
        return None

    def layer_plans(self) -> dict[int, LayerPlan]:
        """Per model layer index, the plan the switch executes (the deferred layer's after the step)."""
        plans = layer_plans(self.manifests)
        if self.deferred_manifests:
            plans.update(layer_plans(self.deferred_manifests))
        return plans


def history_batch(batch: StepBatch, after_step: bool = False) -> ownership.Batch:
    """The batch as the planner sees it: each request's history before the step (or after it)."""
    if after_step:
        return batch.ownership_batch()
    return ownership.Batch(tuple(ownership.Request(int(i), int(s), int(o), int(q))
                                 for i, s, o, q in zip(batch.ids, batch.starts, batch.owners, batch.rows)))


def plan_layers(model, dst: Layout, batch: StepBatch, *, after_step: bool = False,
                layers: tuple[int, ...] | None = None, copied: np.ndarray | None = None,
                copied_layers: tuple[int, ...] | None = None) -> dict:
    """One manifest per source layout among the layers not yet in ``dst`` (usually one), or
    among ``layers`` (model layer indices) of them; histories before the step, or ``after_step``.
    ``copied``: per request of the batch, its leading pages a pre-copy placed already
    (:func:`~splash_core.planning.manifest.plan_switch`), in ``copied_layers`` (None: in every layer). A
    source's layers outside ``copied_layers`` (a pre-copy handed off before it copied them) move
    whole, in a manifest of their own keyed ``(source, "uncopied")``."""
    groups: dict = {}
    for layer in model.layers:
        if layer.layout is not dst and (layers is None or layer.index in layers):
            whole = copied is not None and copied_layers is not None and layer.index not in copied_layers
            groups.setdefault((layer.layout, "uncopied") if whole else layer.layout, []).append(layer.index)
    hist = history_batch(batch, after_step)
    return {key: plan_switch(key[0] if isinstance(key, tuple) else key, dst, hist, model.profile, model.T,
                             model.page_size, layers=idx, copied=None if isinstance(key, tuple) else copied)
            for key, idx in groups.items()}


def layer_plans(manifests: dict[Layout, Manifest]) -> dict[int, LayerPlan]:
    return {lp.index: lp for m in manifests.values() for lp in m.layers}


# ---- the switch's peak (Eq 5) ------------------------------------------------------

def peak_bytes(model, dst: Layout, batch: StepBatch, manifests: dict[Layout, Manifest],
               plans: dict[int, LayerPlan] | None = None) -> np.ndarray:
    """Per rank, the most attention state held at any point of the switch
    (:func:`~splash_core.planning.manifest.fit.switch_peak`), as :attr:`Manifest.peak` for one
    source; layers already in ``dst`` count with their destination footprint. ``plans``: the layer plans the
    switch executes where they are not exactly ``manifests``' (a layer planned after the step)."""
    if plans is None and len(manifests) == 1 and sum(len(m.layers) for m in manifests.values()) == len(model.layers):
        return next(iter(manifests.values())).peak
    plans = layer_plans(manifests) if plans is None else plans
    hist, T = history_batch(batch), model.T
    src, dst_b, transit = [], [], []
    for layer in model.layers:
        lp = plans.get(layer.index)
        if lp is None:
            still = ownership.footprint(dst, hist, model.profile, T, model.page_size, layers=[layer.index]).total
            src.append(still), dst_b.append(still), transit.append(np.zeros(T, dtype=np.int64))
        else:
            src.append(lp.source_bytes), dst_b.append(lp.dest_bytes), transit.append(lp.transit_bytes)
    return switch_peak(np.stack(src), np.stack(dst_b), np.stack(transit))


# ---- pool capacity and stray requests (agreed by one all-reduce) -------------------------

@dataclasses.dataclass(frozen=True)
class PoolCheck:
    """Per rank and paged layer: pages the switching step needs and has free; per rank, pages held
    that belong to no request of the batch (requests left out of it, or never released)."""

    need: np.ndarray  # [T, L]: pages arriving + pages for the step's new tokens
    fetched: np.ndarray  # [T, L]
    free: np.ndarray  # [T, L]
    strays: np.ndarray  # [T]: pages held beyond the batch's histories, over the layers
    layers: tuple[int, ...]
    local_strays: tuple[int, ...] = ()  # this rank's requests outside the batch that hold pages

    def refusal(self) -> str | None:
        short = np.argwhere(self.need > self.free)
        if not short.size:
            return None
        r, i = short[0]
        return (f"KV pool: rank {r} layer {self.layers[i]} needs {self.need[r, i]} free pages during the switch "
                f"({self.fetched[r, i]} arriving + {self.need[r, i] - self.fetched[r, i]} for the step's new "
                f"tokens), {self.free[r, i]} are free ({len(short)} rank-layer pairs short)")

    def stray_error(self) -> str | None:
        if not self.strays.any():
            return None
        r = int(np.flatnonzero(self.strays)[0])
        named = f" (requests {list(self.local_strays)} here)" if self.local_strays else ""
        return (f"rank {r} holds {self.strays[r]} pages beyond the histories of the step's batch{named}: a switch "
                "moves exactly the batch's histories, so release finished requests (model.release) and put "
                "every running request in the batch")


def new_pages_here(layout: Layout, batch: StepBatch, rank: int, T: int) -> int:
    """Pages ``rank`` adds in one layer in ``layout`` for the step's new tokens (the rule of
    :func:`~splash_core.runtime.kv_pool.held_pages`, over every request at once)."""
    first, end = batch.new_pages()
    count = np.maximum(end - first, 0)
    if not count.any():
        return 0
    if layout.ownership is Ownership.ALL:
        return int(count.sum())
    if layout.ownership is Ownership.OWNER:
        return int(count[batch.owners == rank].sum())
    request = np.repeat(np.arange(len(count)), count)
    pages = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + np.repeat(first, count)
    return int((ownership.cp_rank_of_page(batch.ids[request], pages, T) == rank).sum())


def check_pools(model, host, dst: Layout, batch: StepBatch, plans: dict[int, LayerPlan],
                computes_in: dict[int, Layout] | None = None, aside: dict[int, int] | None = None) -> PoolCheck:
    """Gather every rank's page needs for the switching step (a collective on the host
    collectives ``host``): pages arriving in the moving layers plus, in every paged layer, the
    step's new pages, placed by the layout the layer computes the step in (``computes_in``:
    layer index -> layout, default ``dst``); and the pages held beyond the batch's histories
    (each layer's used pages against its layout's share, in closed form; requests are named
    only when they differ). ``aside``: per layer index, pages a pre-copy holds for the
    destination (under ids of its own: neither strays nor free)."""
    paged = model.paged_layers
    aside = aside or {}
    T, rank = model.T, model.rank
    computes_in = computes_in or {}
    placed = {layout: new_pages_here(layout, batch, rank, T) for layout in {dst, *computes_in.values()}}
    new = np.array([placed[computes_in.get(layer.index, dst)] for layer in paged], dtype=np.int64)
    hist = history_batch(batch)
    share = {layout: int(ownership.kv_pages_per_rank(layout, hist, T, model.page_size)[rank])
             for layout in {layer.layout for layer in paged}}
    arriving: dict[int, int] = {}  # per KV plan (shared by the layers of a kind)
    for lp in plans.values():
        kv = lp.states.get(State.KV)
        if kv is not None and id(kv) not in arriving:
            arriving[id(kv)] = len(kv.rank(rank).fetched)
    fetched = np.array([arriving[id(plans[layer.index].states[State.KV])] if layer.index in plans else 0
                        for layer in paged], dtype=np.int64)
    free = np.array([layer.kv.free_pages for layer in paged], dtype=np.int64)
    extra = sum(layer.kv.used_pages - share[layer.layout] - aside.get(layer.index, 0) for layer in paged)
    local = ()
    if extra:
        ids = set(int(i) for i in batch.ids)
        local = tuple(sorted({rid for layer in paged for rid in layer.kv.requests} - ids))
    n = len(paged)
    numbers = np.zeros(3 * T * n + T, dtype=np.int64)
    numbers[: 3 * T * n].reshape(3, T, n)[:, rank] = np.stack([fetched + new, fetched, free])
    numbers[3 * T * n + rank] = extra
    table = torch.from_numpy(numbers)
    host.all_reduce(table)
    table = table.numpy()
    grid = table[: 3 * T * n].reshape(3, T, n)
    return PoolCheck(grid[0], grid[1], grid[2], table[3 * T * n:], tuple(layer.index for layer in paged), local)
