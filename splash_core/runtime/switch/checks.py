"""What must hold before a switch moves anything: the plan is this step's, Eq 5 admitted it, and
one host all-reduce (it never waits for the device) finds room in every rank's pools for the
pages arriving plus the step's new pages, and no request outside the batch holding pages. A
failure raises :class:`~.errors.SwitchRefused` (ValueError for stray requests) on every rank,
with nothing moved."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ...layouts import Layout
from ...planning.manifest import LayerPlan, Manifest
from ..step_batch import StepBatch
from .errors import SwitchRefused
from .landing import PreparedSwitch
from .modes import Mode
from .planner import copied_by
from .planning import SwitchPlan, check_pools
from .precopy import PreCopy
from .report import SwitchReport
from .transfer import StateMover, TransferContext


def check_batch(model, batch: StepBatch) -> None:
    """ValueError unless ``batch`` is for ``model``'s group size and page size."""
    if batch.T != model.T or batch.page_size != model.page_size:
        raise ValueError(f"batch for T={batch.T}, page {batch.page_size}; model has T={model.T}, "
                         f"page {model.page_size}")


def check_plan(plan: SwitchPlan, model, dst: Layout, mode: Mode, batch: StepBatch,
               precopy: PreCopy | None) -> None:
    """ValueError unless ``plan`` was planned for this step: ``model``'s layer layouts, ``batch``,
    ``dst`` in ``mode``, and the pre-copy it hands off (if any)."""
    mismatch = plan.matches(tuple(layer.layout for layer in model.layers), batch)
    if plan.dst is not dst or plan.mode is not mode or mismatch:
        raise ValueError(f"the switch plan (to {plan.dst}, {plan.mode}) is not this step's (to {dst}, {mode}): "
                         f"{mismatch or 'another destination or mode'}")
    copied, held = copied_by(precopy, dst, batch)
    if ((copied is None) != (plan.copied is None) or held != plan.copied_layers
            or (copied is not None and not np.array_equal(copied, plan.copied))):
        raise ValueError("the switch plan was not planned with this step's pre-copy (plan_switch(..., precopy=))")


def prepare(model, plan: SwitchPlan, movers: list[StateMover], side: Callable[[], TransferContext],
            batch: StepBatch, precopy: PreCopy | None) -> PreparedSwitch:
    """The checked switch ``plan`` describes, every state of every moving layer assigned to its
    mover and this rank's routes prepared over ``side()`` (the side communicator, which every rank
    creates here on its first switch that moves something: the routes depend on it); raises before
    anything moves."""
    dst, layouts = plan.dst, plan.layouts
    src = layouts[0] if len(set(layouts)) == 1 else "mixed"
    order = tuple(pos for pos, layout in enumerate(layouts) if layout is not dst)
    if not order:
        return PreparedSwitch(dst, src, (), 0.0, computes_in=(dst,) * len(model.layers))
    io = side()
    t0 = time.perf_counter()
    for manifests in (plan.manifests, plan.deferred_manifests or {}):
        ready_routes(model, movers, manifests, io)
    plans = plan.layer_plans()
    computes_in = tuple(dst if pos in order and pos != plan.deferred else layout for pos, layout in enumerate(layouts))
    sw = PreparedSwitch(dst, src, order, plan.plan_ms + (time.perf_counter() - t0) * 1e3, plan.deferred,
                        computes_in, precopy=precopy)
    per_kind: dict[int, tuple] = {}  # layers of a kind share one states mapping
    for lp in plans.values():
        if id(lp.states) not in per_kind:
            per_kind[id(lp.states)] = assign_movers(movers, lp)
        sw.movers[lp.index] = per_kind[id(lp.states)]
    if plan.refusal:
        raise refused(sw, plan.mode, plan.refusal)
    pools = check_pools(model, io.host, dst, batch, plans,
                        {layer.index: layout for layer, layout in zip(model.layers, computes_in)},
                        precopy.aside() if precopy is not None else None)
    stray = pools.stray_error()
    if stray:
        raise ValueError(stray)
    reason = pools.refusal()
    if reason:
        raise refused(sw, plan.mode, reason)
    return sw


def ready_routes(model, movers: list[StateMover], manifests: dict[Layout, Manifest], io: TransferContext | None) -> None:
    """This rank's key arrays and the movers' per-kind routes of ``manifests`` (each built once per
    plan: a layer's transfer then does only that layer's own work)."""
    layers = {layer.index: layer for layer in model.layers}
    for manifest in manifests.values():
        for lp in manifest.classes():
            for state_plan in lp.states.values():
                state_plan.rank(model.rank)
            for mover in movers:
                prepare_route = getattr(mover, "prepare", None)
                mine = {s: p for s, p in lp.states.items() if s in mover.states}
                if prepare_route is not None and mine:
                    prepare_route(layers[lp.index], mine, model.rank, model.T, io)


def assign_movers(movers: list[StateMover], lp: LayerPlan) -> tuple[tuple[StateMover, dict], ...]:
    """Each mover that moves some of ``lp``'s states, with their plans."""
    missing = set(lp.states) - {s for mover in movers for s in mover.states}
    if missing:
        raise ValueError(f"layer {lp.index} ({lp.kind}) has state {sorted(map(str, missing))} that no mover "
                         f"moves; pass one to SwitchExecutor(movers=...) (see switch.transfer.StateMover)")
    return tuple((mover, mine) for mover in movers
                 if (mine := {s: lp.states[s] for s in mover.states if s in lp.states}))


def refused(sw: PreparedSwitch, mode: Mode, reason: str) -> SwitchRefused:
    report = SwitchReport(sw.src, sw.dst, mode, plan_ms=sw.plan_ms, refused=True,
                          reason=f"switch {sw.src}→{sw.dst} refused, nothing moved: {reason}")
    return SwitchRefused(report.reason, report)
