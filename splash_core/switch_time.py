"""Eq 7: the exposed time of a switch, from a planned manifest and the destination layout's
per-layer time (layer i's transfer hides behind layer i−1's computation)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from .layouts import Primitive


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


def layer_transfer_times(manifest, model) -> np.ndarray:
    """Per planned layer of a :class:`~splash_core.manifest.Manifest`, with the bandwidths and
    latency of a :class:`~splash_core.costmodel.CostModel` (``model``): the busiest rank's
    received bytes of each state over the primitive's bandwidth, plus one latency per
    collective (a discard costs nothing)."""
    per_kind = {}
    for kind, layer in manifest.kinds().items():
        t = 0.0
        for plan in layer.states.values():
            if plan.primitive is not Primitive.DISCARD:
                t += float(plan.fetched_bytes.max()) / model.bw[plan.primitive] + model.latency
        per_kind[kind] = t
    return np.array([per_kind[layer.kind] for layer in manifest.layers])


def switch_cost(manifest, model, dest) -> SwitchCost:
    """Eq 7 for a planned switch, layer i−1 computing in the destination layout (``dest``: its
    :class:`~splash_core.costmodel.StepTime`, whose per-layer times include host overhead)."""
    transfer = layer_transfer_times(manifest, model)
    compute = np.array([dest.layer_s.get(layer.kind, 0.0) for layer in manifest.layers])
    return SwitchCost(exposed_switch_time(transfer, compute), float(transfer.sum()),
                      tuple(transfer.tolist()), tuple(compute.tolist()))
