"""Planning a switching step: the manifests of the layers not yet in the destination (cached), the
layer that moves after the step, and Eq 5's verdict (:class:`~.planning.SwitchPlan`). Pure given
the model's layer layouts: rank 0 plans a serving group's switch and every rank executes that plan."""

from __future__ import annotations

import collections
import time

import numpy as np

from ...layouts import Layout, Primitive
from ...planning.manifest import LayerPlan, Manifest, eq5_fit
from ...planning.scheduler import SwitchCheck
from ...profiles.transfer import TransferConfig
from ..step_batch import StepBatch
from .modes import Mode
from .planning import SwitchPlan, history_batch, layer_plans, peak_bytes, plan_layers
from .precopy import PreCopy

_CACHED_PLANS = 8  # a back-and-forth between layouts, or a plan made one step ahead, stays cached


class SwitchPlanner:
    """Plans switches of ``model``'s layers. ``transfer.defer_first``: in ``splash``, the first moving
    layer computes the step in its source layout and moves after the last one, unless it only
    discards. ``budget_bytes``/``reserve_bytes``: H_r less the state outside attention, and R_r, for
    Eq 5 (None: not checked)."""

    def __init__(self, model, transfer: TransferConfig, budget_bytes: float | None, reserve_bytes: float):
        self.model, self.transfer = model, transfer
        self.budget_bytes, self.reserve_bytes = budget_bytes, reserve_bytes
        self.cache: collections.OrderedDict[tuple, dict[Layout, Manifest]] = collections.OrderedDict()

    def manifests(self, dst: Layout, batch: StepBatch, after_step: bool = False,
                  layers: tuple[int, ...] | None = None, copied: np.ndarray | None = None,
                  copied_layers: tuple[int, ...] | None = None) -> dict[Layout, Manifest]:
        """The manifests of the switch to ``dst``, one per source layout among the layers not in
        ``dst`` (or among ``layers``, by model index), of the histories before the step (or
        ``after_step``); the last few are cached by (destination, layer layouts, requests' ids,
        owners, starts and, after the step, rows). ``copied``: the leading pages of each request a
        pre-copy placed already (in ``copied_layers``; :func:`~.planning.plan_layers`)."""
        key = (dst, tuple(layer.layout for layer in self.model.layers), batch.ids.tobytes(),
               batch.owners.tobytes(), batch.starts.tobytes(), batch.T, batch.page_size,
               batch.rows.tobytes() if after_step else None, layers, None if copied is None else copied.tobytes(),
               copied_layers)
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        manifests = plan_layers(self.model, dst, batch, after_step=after_step, layers=layers, copied=copied,
                                copied_layers=copied_layers)
        self.cache[key] = manifests
        while len(self.cache) > _CACHED_PLANS:
            self.cache.popitem(last=False)
        return manifests

    def plan_switch(self, dst: Layout, batch: StepBatch, mode: Mode, *, decided: SwitchCheck | None = None,
                    precopy: PreCopy | None = None) -> SwitchPlan:
        """The switching step to ``dst`` at ``batch``'s step in ``mode``: the manifests, the layer
        that moves after the step (and its manifests of the histories after it) and Eq 5's verdict.
        ``decided``: the scheduler's check of this switch; where it fits, Eq 5 is not checked again,
        and its manifest is the switch's where it planned the same switch of the same histories.
        ``precopy``: the pre-copy to ``dst`` this step hands off; its copied pages count as held, so
        only the dirty tails move (and Eq 5 counts the copies as held), and the layers it has not
        copied yet (it hands off before completing) move whole."""
        m = self.model
        layouts = tuple(layer.layout for layer in m.layers)
        key = SwitchPlan.key_of(batch)
        copied, held = copied_by(precopy, dst, batch)
        order = tuple(pos for pos, layout in enumerate(layouts) if layout is not dst)
        if not order:
            return SwitchPlan(dst, mode, layouts, key, {}, copied=copied, copied_layers=held)
        t0 = time.perf_counter()
        manifests = self._decided(decided, dst, batch, copied) or self.manifests(dst, batch, copied=copied,
                                                                                copied_layers=held)
        plans = layer_plans(manifests)
        deferred, after = None, None
        if self._defers(mode, order[0], plans[m.layers[order[0]].index]):
            deferred = order[0]
            after = self.manifests(dst, batch, after_step=True, layers=(m.layers[deferred].index,), copied=copied,
                                   copied_layers=held)
            plans.update(layer_plans(after))
        refusal = None
        checked = decided is not None and decided.fits and precopy is None
        if not checked and self.budget_bytes is not None:
            peak = peak_bytes(m, dst, batch, manifests, plans if deferred is not None else None)
            refusal = eq5_fit(peak, self.budget_bytes, self.reserve_bytes).refusal()
        return SwitchPlan(dst, mode, layouts, key, manifests, deferred, after,
                          (time.perf_counter() - t0) * 1e3, refusal, copied, held)

    def _decided(self, decided: SwitchCheck | None, dst: Layout, batch: StepBatch, copied) -> dict | None:
        """The manifest the scheduler planned for this switch, where it is the one this step moves:
        every layer in its source, to ``dst``, the same layers and histories, nothing pre-copied."""
        if decided is None or decided.manifest is None or decided.batch is None or copied is not None:
            return None
        m, man = self.model, decided.manifest
        same = ({layer.layout for layer in m.layers} == {man.src} and man.dst is dst and man.T == m.T
                and man.page_size == m.page_size and [lp.index for lp in man.layers] == [l.index for l in m.layers])
        if not same or _histories(decided.batch) != _histories(history_batch(batch)):
            return None
        return {man.src: man}

    def _defers(self, mode: Mode, first: int, plan: LayerPlan) -> bool:
        """Whether the first moving layer (position ``first``, plan ``plan``) computes the step in
        its source layout and moves last: in ``splash``, where a later layer exists to hide its
        transfer and it moves something over the network (a discard is ready at once)."""
        return (mode is Mode.SPLASH and self.transfer.defer_first and first < len(self.model.layers) - 1
                and any(p.primitive is not Primitive.DISCARD for p in plan.states.values()))


def copied_by(precopy: PreCopy | None, dst: Layout, batch: StepBatch) -> tuple[np.ndarray | None, tuple | None]:
    """The pages ``precopy`` placed for ``batch``'s requests, once it may hand off to ``dst``, and
    the layers it placed them in (None: every layer, it completed)."""
    if precopy is None:
        return None, None
    if precopy.dst is not dst or precopy.cancelled:
        state = "cancelled" if precopy.cancelled else f"not to {dst}"
        raise ValueError(f"the pre-copy to {precopy.dst} cannot hand off a switch to {dst} ({state})")
    precopy.check(batch)
    return precopy.copied_pages(batch), None if precopy.complete else tuple(sorted(precopy.holding))


def _histories(batch) -> set[tuple[int, int, int]]:
    """(id, owner, tokens) of each request of ``batch`` that has a history."""
    return {(int(r.id), int(r.owner), int(r.context)) for r in batch.requests if r.context > 0}
