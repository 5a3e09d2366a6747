"""What the cost model returns (:class:`~splash_core.planning.costmodel.CostModel`): Eq 10's step
time of every layout with its parts, and Eq 6's per-rank memory."""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from ..layouts import LAYOUTS, Layout
from ..profiles.model import LayerKind


@dataclasses.dataclass(frozen=True)
class StepTime:
    """t_ℓ(x; θ) of Eq 10 for one layout, with its parts (seconds, summed over layers)."""

    layout: Layout
    total_s: float
    overhead_s: float  # t0
    proj_s: float
    att_s: float
    latency_s: float  # δ
    comm_s: float  # R before overlap
    exposed_comm_s: float  # [R − η t_att]+
    host_s: float  # [h_ℓ − η_h t_dev]+: host overhead not hidden behind the device
    ffn_s: float  # dense/MoE blocks (the same in every layout but where a MoE dispatches by all-to-all)
    layer_s: Mapping[LayerKind, float]  # one attention layer of each kind, host included (Eq 7's compute)
    bounds: Mapping[str, str]  # "proj"/"att" -> "compute" or "memory" (the costliest layer kind's)


@dataclasses.dataclass(frozen=True)
class Estimates:
    """Eq 10 and Eq 6's W + K + A for every layout of one batch: arrays indexed like LAYOUTS."""

    total_s: np.ndarray
    overhead_s: float
    proj_s: np.ndarray
    att_s: np.ndarray
    latency_s: np.ndarray
    comm_s: np.ndarray
    exposed_comm_s: np.ndarray
    host_s: np.ndarray
    ffn_s: np.ndarray
    layer_s: Mapping[LayerKind, np.ndarray]
    proj_compute_bound: np.ndarray  # of the costliest layer kind
    att_compute_bound: np.ndarray
    memory_bytes: np.ndarray  # [layouts, T]: W_r + K_r + A_r
    scratch_bytes: np.ndarray  # [layouts, T]: A_r alone

    def step_time(self, layout: Layout) -> StepTime:
        i = LAYOUTS.index(layout)
        bound = {True: "compute", False: "memory"}
        return StepTime(layout, float(self.total_s[i]), self.overhead_s, float(self.proj_s[i]), float(self.att_s[i]),
                        float(self.latency_s[i]), float(self.comm_s[i]), float(self.exposed_comm_s[i]),
                        float(self.host_s[i]), float(self.ffn_s[i]), {k: float(v[i]) for k, v in self.layer_s.items()},
                        {"proj": bound[bool(self.proj_compute_bound[i])], "att": bound[bool(self.att_compute_bound[i])]})
