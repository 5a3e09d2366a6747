"""Eq 7: the exposed time of a switch, from a planned manifest and the destination layout's
per-layer time (layer i's transfer hides behind layer i−1's computation), with per-layer
transfer times from the calibrated transfer law of Eq 13-14 where the hardware profile has
references, else bytes / bandwidth + latency; plus, where the backend captures decode graphs,
the re-capture a switch that moves weights needs (:mod:`splash_core.planning.graph_costs`)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ..layouts import Layout, Primitive, State
from ..profiles.model import LayerKind
from .ownership import Batch, layer_indices

WEIGHTS, KV = "weights", "kv"  # the two state classes Eq 14's references time


def exposed_switch_time(transfer_s: Sequence[float], compute_s: Sequence[float]) -> float:
    """Eq 7: t_xfer,1 + Σ_{i≥2} [t_xfer,i − t_comp,i−1]+.

    ``transfer_s[i]`` is layer i's transfer, ``compute_s[i]`` its computation in the
    destination layout; layer i's transfer hides behind layer i−1's computation."""
    xfer = np.asarray(transfer_s, dtype=np.float64)
    if not len(xfer):
        return 0.0
    comp = np.asarray(compute_s, dtype=np.float64)
    return float(xfer[0] + np.maximum(xfer[1:] - comp[:-1], 0.0).sum())


@dataclasses.dataclass(frozen=True)
class SwitchCost:
    """What one switch costs in time: Eq 7's exposed part and the blocking total."""

    exposed_s: float
    blocking_s: float  # every layer's transfer back to back (the paper's blocking mode)
    transfer_s: tuple[float, ...]  # per planned layer
    compute_s: tuple[float, ...]  # per planned layer, destination layout
    recapture_s: float = 0.0  # capturing the destination's decode graph again (in both totals)

    @property
    def transfer_exposed_s(self) -> float:
        """Eq 7's exposed transfer time alone."""
        return self.exposed_s - self.recapture_s


def state_class(state: State) -> str:
    return WEIGHTS if state is State.WEIGHTS else KV


def _class_bytes(layer) -> dict[str, np.ndarray]:
    """Bytes each rank receives per state class in one planned layer (network states only)."""
    out: dict[str, np.ndarray] = {}
    for state, plan in layer.states.items():
        if plan.primitive is not Primitive.DISCARD:
            key = state_class(state)
            out[key] = out.get(key, 0) + plan.fetched_bytes
    return out


class TransferLaw:
    """Eq 14 generalised to any batch: a direction's reference time per layer, scaled by the
    bytes the busiest rank receives against what it received in the reference switch
    (``batch`` × ``context`` balanced requests, planned once per direction and layer kind).
    For equal requests this is Eq 14's linear law in B·s; weights move a fixed volume."""

    def __init__(self, reference, model, T: int, page_size: int, layers=None):
        self.reference, self.model, self.T, self.page_size = reference, model, T, page_size
        self.layers = layer_indices(model, layers)
        self._bytes: dict = {}

    def per_layer_s(self, kind, src: Layout, dst: Layout, key: str, fetched: float) -> float | None:
        """Seconds for one layer of ``kind`` receiving ``fetched`` bytes of class ``key``
        (None: no reference for this direction, or the reference moved nothing)."""
        if key == KV and kind is not LayerKind.MLA:
            return None  # the references time MLA histories; recurrent state moves by bytes / bandwidth
        t_ref = self.reference.per_layer_s(key, src, dst)
        if t_ref is None:
            return None
        ref = self._reference_bytes(kind, src, dst).get(key)
        if ref is None or ref <= 0:
            return None
        return t_ref * fetched / ref

    def _reference_bytes(self, kind, src: Layout, dst: Layout) -> dict[str, float]:
        key = (kind, src, dst)
        if key not in self._bytes:
            from .manifest import plan_switch  # the planner imports the cost model's loads

            layer = next(i for i in self.layers if self.model.layer_kinds[i] is kind)
            batch = Batch.balanced(self.reference.batch, self.reference.context, self.T)
            plan = plan_switch(src, dst, batch, self.model, self.T, self.page_size, layers=[layer]).layers[0]
            self._bytes[key] = {k: float(v.max()) for k, v in _class_bytes(plan).items()}
        return self._bytes[key]


def layer_transfer_times(manifest, model) -> np.ndarray:
    """Per planned layer of a :class:`~splash_core.planning.manifest.Manifest`, with a
    :class:`~splash_core.planning.costmodel.CostModel` (``model``): each state class's time from the
    transfer law (Eq 13-14) where the hardware profile has a reference for the direction,
    else the busiest rank's received bytes over the primitive's bandwidth plus one latency
    per collective (a discard costs nothing)."""
    law = getattr(model, "transfer_law", None)
    per_class = {}  # layers sharing their state plans (a kind, or its layers storing no indexer keys) take alike
    for layer in manifest.classes():
        kind, t = layer.kind, 0.0
        by_class = _class_bytes(layer)
        for key, fetched in by_class.items():
            scaled = None if law is None else law.per_layer_s(kind, manifest.src, manifest.dst, key,
                                                              float(fetched.max()))
            if scaled is not None:
                t += scaled
                continue
            for state, plan in layer.states.items():
                if plan.primitive is not Primitive.DISCARD and state_class(state) == key:
                    t += float(plan.fetched_bytes.max()) / model.bw[plan.primitive] + model.latency
        per_class[id(layer.states)] = t
    return np.array([per_class[id(layer.states)] for layer in manifest.layers])


def switch_cost(manifest, model, dest, x=None) -> SwitchCost:
    """Eq 7 for a planned switch, layer i−1 computing in the destination layout (``dest``: its
    :class:`~splash_core.planning.costmodel.StepTime`, whose per-layer times include host overhead;
    each layer's share of the shared dense/MoE blocks computes too). Given the batch ``x`` (a
    :class:`~splash_core.planning.costmodel.BatchArrays`) and a cost model whose backend captures decode
    graphs, a switch that moves weights also pays the capture of the destination's graph of the
    batch's bucket (:meth:`~splash_core.planning.graph_costs.GraphCosts.recapture_s`): it blocks the
    first decode step after the switch."""
    transfer = layer_transfer_times(manifest, model)
    shared = dest.ffn_s / max(1, len(manifest.layers))
    compute = np.array([dest.layer_s.get(layer.kind, 0.0) + shared for layer in manifest.layers])
    graphs = getattr(model, "graph_costs", None)
    recapture = 0.0 if graphs is None or x is None else graphs.recapture_s(manifest.src, manifest.dst, x)
    return SwitchCost(exposed_switch_time(transfer, compute) + recapture, float(transfer.sum()) + recapture,
                      tuple(transfer.tolist()), tuple(compute.tolist()), recapture)
