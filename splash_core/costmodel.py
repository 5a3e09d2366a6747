"""The stage-wise cost model of appendix B (Eq 10) and each layout's own traffic (Eq 4 and
friends); Eq 7's switch time is in :mod:`splash_core.switch_time`, the batch's per-rank loads
in :mod:`splash_core.batch_loads` (both re-exported here: the cost model's public API).

For a layout ℓ and the busiest rank's loads (Table 2, exact for any batch via
:mod:`splash_core.loads`; :func:`rank_loads` is the vectorised equivalent the scheduler uses),
one layer of each kind costs

    t_proj = max(F_proj / Φ, W_read / β_W)          projections: compute- or weight-read-bound
    t_att  = max(F_att / Φ, K_read / β_KV)          attention: compute- or KV-read-bound
    t_dev  = t_proj + t_att + δ + [R − η t_att]+     δ: collective latency, R: bandwidth cost
    t_layer = t_dev + [h_ℓ − η_h t_dev]+             h_ℓ: host time per layer, η_h: how much of it hides

and a step costs t_ℓ = t0 + Σ_layers t_layer (Eq 10 summed over the layers). θ comes from a
hardware profile, η from the deployment's ``scheduler.overlap``.

The host term belongs with t0 and δ, the fixed costs of Eq 10: what a real runtime spends per
layer outside the modelled stages (kernel launches, Python, synchronisation), measured per
layout by ``splash calibrate`` (:mod:`splash_core.calibrate_runtime`). On an accelerator
the host queues work ahead of the device, so host time hides behind device time (η_h near
1: the layer takes the longer of the two); on the host backend the two add (η_h near 0). A
profile without the term (the paper's, a datasheet's) gives Eq 10 as printed.

Each layout's traffic per layer (bytes the busiest rank receives; b = activation bytes):

- TP: the O projection's partial sums are reduced: N·d·b over the all-reduce rate (1 collective).
- DP: hidden states are gathered around the dense part and scattered back: 2 × (N − N_r)·d·b
  at the all-gather rate (2 collectives).
- DOP: Eq 4's exchange, query rows to owners N_r·H(1 − 1/T)·d_q·b and outputs back
  (N − N_r)·(H/T)·d_z·b at the all-to-all rate, plus TP's O reduction (3 collectives).
- CP: partial outputs and log-sum-exps of every row, (T − 1)·N·H·(d_z·b + 4), at the
  all-gather rate, merged locally (1 collective); projections run on every row, replicated.

KDA layers follow the same rules with their own widths, except that CP keeps each request's
recurrent state on its owner, so a CP rank computes KDA like DP. The dense/MoE part is the
same in every layout and is not modelled (it cancels in the argmin of Eq 8); a calibrated
host term absorbs what it costs on the machine it was measured on.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from . import dtypes, weights
from .batch_loads import BatchArrays, RankLoads, rank_loads
from .layouts import LAYOUTS, Layout, Placement, Primitive
from .ownership import layer_indices
from .profiles.hardware import HardwareProfile
from .profiles.model import LayerKind, ModelProfile
from .switch_time import SwitchCost, exposed_switch_time, layer_transfer_times, switch_cost

__all__ = ["BatchArrays", "RankLoads", "rank_loads", "KindCosts", "kind_costs", "StepTime", "Estimates",
           "CostModel", "weight_fraction", "dop_exchange_bytes", "eq4_volume", "SwitchCost",
           "exposed_switch_time", "layer_transfer_times", "switch_cost"]

GB = 1e9
_LSE_BYTES = 4  # one fp32 log-sum-exp per row and head
_I = {layout: i for i, layout in enumerate(LAYOUTS)}  # row of each layout in the stacked arrays


@dataclasses.dataclass(frozen=True)
class KindCosts:
    """Per-layer constants of one layer kind, computed once per deployment."""

    kind: LayerKind
    layers: int
    heads: int
    weight_bytes: float  # head-indexed projections of one layer (Eq 9's S_A)
    replicated_bytes: float  # Q-A / KV-A style weights every rank reads when it has rows
    flops_row_sharded: float  # all heads
    flops_row_replicated: float
    flops_pair: float  # MLA attention per (row, key), all heads
    flops_row_state: float  # KDA recurrent update per row, all heads
    kv_bytes_token: float  # MLA latent + rotary (+ indexer) per token
    state_bytes_request: float  # KDA recurrent state + conv caches per request
    width_to_owner: int  # DOP: elements per row and head sent to owners (d_q)
    width_from_owner: int  # DOP: elements per row and head returned (d_z)
    scratch_bytes_row: float  # A of Eq 6: activations of one row in one layer


def kind_costs(model: ModelProfile, kind: LayerKind, layers: int, act_bytes: int) -> KindCosts:
    d, w_bytes = model.hidden_size, dtypes.nbytes(model.weight_dtype)
    params = sum(p.params for p in weights.projections(model, kind))
    if kind is LayerKind.MLA:
        m = model.mla
        replicated = d * m.q_lora_rank + d * (m.kv_lora_rank + m.qk_rope_head_dim)  # Q-A, KV-A
        d_q, d_z = m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank  # absorbed MLA (Eq 4)
        flops_pair = 2.0 * m.heads * (d_q + d_z)
        if model.indexer is not None:  # indexer scores every visible key
            flops_pair += 2.0 * model.indexer.heads * model.indexer.head_dim
        return KindCosts(kind, layers, m.heads, params * w_bytes, replicated * w_bytes, 2.0 * params,
                         2.0 * replicated, flops_pair, 0.0,
                         model.kv_bytes_per_token_layer + model.indexer_bytes_per_token_layer, 0.0,
                         d_q, d_z, act_bytes * (2 * d + m.heads * (d_q + d_z)))
    k = model.kda
    # the recurrent update touches each [K, V] state element about three times per row (decay,
    # the k·vᵀ write, the q·S read-out): 6 flops; q, k, v go to owners in DOP, outputs come back
    return KindCosts(kind, layers, k.heads, params * w_bytes, 0.0, 2.0 * params, 0.0, 0.0,
                     6.0 * k.heads * k.head_dim * k.head_dim, 0.0, model.recurrent_bytes_per_request_layer,
                     3 * k.head_dim, k.head_dim, act_bytes * (2 * d + 4 * k.heads * k.head_dim))


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
    layer_s: Mapping[LayerKind, float]  # one layer of each kind, host included (Eq 7's per-layer compute)
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
                        float(self.host_s[i]), {k: float(v[i]) for k, v in self.layer_s.items()},
                        {"proj": bound[bool(self.proj_compute_bound[i])], "att": bound[bool(self.att_compute_bound[i])]})


class CostModel:
    """Eq 10 for one deployment: θ from the hardware profile, η per layout, model dims.

    Per-layout constants are computed once here; :meth:`evaluate` then costs every layout
    of a batch in one vectorised pass (the scheduler calls it every step)."""

    def __init__(self, model: ModelProfile, hardware: HardwareProfile, T: int, *, page_size: int,
                 compute_dtype: str = "bf16", overlap: Mapping[Layout, float] | None = None,
                 layers: Sequence[int] | None = None):
        self.model, self.hardware, self.T, self.page_size = model, hardware, T, page_size
        self.act_bytes = dtypes.nbytes(compute_dtype)
        self.eta = np.array([float((overlap or {}).get(l, 0.0)) for l in LAYOUTS])
        kinds = [model.layer_kinds[i] for i in layer_indices(model, layers)]
        self.kinds = tuple(kind_costs(model, k, kinds.count(k), self.act_bytes)
                           for k in LayerKind if kinds.count(k))
        h = hardware
        self.flops = h.matmul_tflops.value * 1e12
        self.weight_bw, self.kv_bw = h.weight_read_gbps.value * GB, h.kv_read_gbps.value * GB
        self.bw = {Primitive.ALL_GATHER: h.all_gather_gbps.value * GB,
                   Primitive.ALL_TO_ALL: h.all_to_all_gbps.value * GB, "all_reduce": h.all_reduce_gbps.value * GB}
        self.latency = h.collective_latency_us.value * 1e-6 if T > 1 else 0.0
        self.overhead = h.step_overhead_us.value * 1e-6
        self.host_list = [h.layer_overhead_s(l) for l in LAYOUTS]  # h_ℓ (zeros without calibration)
        self.host_overlap = h.host_overlap_fraction  # η_h
        self.frac = np.array([weight_fraction(l, T) for l in LAYOUTS])
        self.frac_list, self.eta_list = self.frac.tolist(), self.eta.tolist()
        self.weights_bytes = sum(kc.layers * kc.weight_bytes for kc in self.kinds) * self.frac  # W_r per layout
        self.kv_bytes_token = sum(kc.layers * kc.kv_bytes_token for kc in self.kinds)  # k of Eq 1
        self.state_bytes_request = sum(kc.layers * kc.state_bytes_request for kc in self.kinds)
        # collectives per layer kind and layout (Eq 10's δ counts them)
        counts = {Layout.TP: 1, Layout.CP: 1, Layout.DP: 2, Layout.DOP: 3}
        self.collectives = {kc.kind: [(2 if (l is Layout.CP and kc.kind is LayerKind.KDA) else counts[l]) * (T > 1)
                                      for l in LAYOUTS] for kc in self.kinds}

    @classmethod
    def from_deployment(cls, deployment) -> "CostModel":
        layers = None if deployment.layers is None else range(deployment.layers)
        return cls(deployment.model, deployment.hardware, deployment.T, page_size=deployment.page_size,
                   compute_dtype=deployment.compute_dtype, overlap=deployment.scheduler.overlap, layers=layers)

    def evaluate(self, x: BatchArrays, loads: RankLoads | None = None) -> Estimates:
        """t_ℓ(x; θ) (Eq 10) and per-rank W + K + A (Eq 6) of every layout.

        The [layout, rank] loads are reduced to the busiest rank with a few numpy calls;
        the per-layout formulas then run on Python floats (four layouts: cheaper than numpy)."""
        ld = loads if loads is not None else rank_loads(x, self.T, self.page_size)
        n_layouts = len(LAYOUTS)
        own_list = ld.own_rows[_I[Layout.DOP]].tolist()  # owner rows (the same in CP, DP, DOP)
        n, own_min, own_max = float(sum(own_list)), min(own_list, default=0.0), max(own_list, default=0.0)
        # rows: proj, att, lat, comm, exposed, host, total (then per-kind layer times), per layout
        sums = [[0.0] * n_layouts for _ in range(7)]
        layer_s, proj_cb, att_cb, costliest = {}, [False] * n_layouts, [False] * n_layouts, [-1.0] * n_layouts
        scratch = None
        for kc in self.kinds:
            rows = ld.proj_rows
            if kc.kind is LayerKind.KDA:  # CP keeps KDA state on the owner, which computes it
                rows = rows.copy()
                rows[_I[Layout.CP]] = ld.own_rows[_I[Layout.CP]]
            kind_scratch = rows * kc.scratch_bytes_row
            scratch = kind_scratch if scratch is None else np.maximum(scratch, kind_scratch)
            busiest_rows = rows.max(axis=1).tolist()
            att_c, att_m = self._attention(kc, ld)
            comm = self._communication(kc, n, own_min, own_max)
            collectives, n_layers = self.collectives[kc.kind], kc.layers
            layer = [0.0] * n_layouts
            for i in range(n_layouts):
                frac = self.frac_list[i]
                p_c = busiest_rows[i] * (frac * kc.flops_row_sharded + kc.flops_row_replicated) / self.flops
                p_m = (frac * kc.weight_bytes + kc.replicated_bytes) / self.weight_bw if busiest_rows[i] else 0.0
                t_proj, t_att = max(p_c, p_m), max(att_c[i], att_m[i])
                t_exp = max(0.0, comm[i] - self.eta_list[i] * t_att)
                t_lat = collectives[i] * self.latency
                t_dev = t_proj + t_att + t_lat + t_exp
                t_host = max(0.0, self.host_list[i] - self.host_overlap * t_dev)
                layer[i] = t = t_dev + t_host
                for row, value in zip(sums, (t_proj, t_att, t_lat, comm[i], t_exp, t_host, t)):
                    row[i] += n_layers * value
                if n_layers * t > costliest[i]:  # report the bounds of the costliest kind
                    costliest[i] = n_layers * t
                    proj_cb[i], att_cb[i] = p_c >= p_m, att_c[i] >= att_m[i]
            layer_s[kc.kind] = layer
        memory = (self.weights_bytes[:, None] + ld.reserved_pages * (self.page_size * self.kv_bytes_token)
                  + ld.state_requests * self.state_bytes_request + scratch)
        sums[6] = [self.overhead + t for t in sums[6]]
        proj, att, lat, comm, exposed, host, total = np.array(sums)
        return Estimates(total, self.overhead, proj, att, lat, comm, exposed, host,
                         {k: np.array(v) for k, v in layer_s.items()}, np.array(proj_cb), np.array(att_cb),
                         memory, scratch)

    def step_time(self, layout: Layout, x: BatchArrays) -> StepTime:
        return self.evaluate(x).step_time(layout)

    # ---- stages of one layer, every layout at once -------------------------------------

    def _attention(self, kc: KindCosts, ld: RankLoads) -> tuple[list[float], list[float]]:
        """Busiest rank's attention compute and read time per layout (each may peak on a
        different rank; Eq 10 takes the larger)."""
        if kc.kind is LayerKind.MLA:
            compute = ld.pairs * (kc.flops_pair / self.flops)
            memory = ld.kv_tokens * (kc.kv_bytes_token / self.kv_bw)
        else:  # KDA: recurrent update per row (TP: its head share), state read and written once
            compute = ld.own_rows * (kc.flops_row_state / self.flops)
            memory = ld.state_requests * (2.0 * kc.state_bytes_request / self.kv_bw)
        return compute.max(axis=1).tolist(), memory.max(axis=1).tolist()

    def _communication(self, kc: KindCosts, n: float, own_min: float, own_max: float) -> list[float]:
        """R of one layer (seconds at the busiest rank) per layout, from the owner rows."""
        T = self.T
        if T == 1:
            return [0.0] * len(LAYOUTS)
        hidden = self.model.hidden_size * self.act_bytes
        reduce_o = n * hidden / self.bw["all_reduce"]
        gather_scatter = 2.0 * (n - own_min) * hidden / self.bw[Primitive.ALL_GATHER]
        # dop_exchange_bytes peaks at the owner of the most rows (to it) and of the fewest (from it)
        to_owner = own_max * kc.heads * (1.0 - 1.0 / T) * kc.width_to_owner * self.act_bytes
        from_owner = (n - own_min) * (kc.heads / T) * kc.width_from_owner * self.act_bytes
        dop = (to_owner + from_owner) / self.bw[Primitive.ALL_TO_ALL] + reduce_o
        if kc.kind is LayerKind.KDA:
            cp = gather_scatter
        else:
            cp = (T - 1) * n * kc.heads * (kc.width_from_owner * self.act_bytes + _LSE_BYTES) \
                / self.bw[Primitive.ALL_GATHER]
        by_layout = {Layout.TP: reduce_o, Layout.CP: cp, Layout.DP: gather_scatter, Layout.DOP: dop}
        return [by_layout[l] for l in LAYOUTS]


def weight_fraction(layout: Layout, T: int) -> float:
    return 1.0 / T if layout.placement is Placement.SHARDED else 1.0


def dop_exchange_bytes(own_rows, heads: int, width_to_owner: int, width_from_owner: int,
                       elem_bytes: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each rank receives in DOP's two exchanges of one layer (Eq 4 per rank).

    Owner r receives its N_r rows for the (1 − 1/T)·H heads other ranks computed, then every
    rank receives its H/T heads of the N − N_r rows owned elsewhere. Summed over ranks this is
    Eq 4: V_DOP = (1 − 1/T)·N·H·(d_q + d_z)·b."""
    own = np.asarray(own_rows, dtype=np.float64)
    n = own.sum()
    to_owner = own * heads * (1.0 - 1.0 / T) * width_to_owner * elem_bytes
    from_owner = (n - own) * (heads / T) * width_from_owner * elem_bytes
    return to_owner, from_owner


def eq4_volume(rows: int, heads: int, d_q: int, d_z: int, elem_bytes: int, T: int) -> float:
    """Eq 4 as printed: aggregate bytes received by DOP's two exchanges of one layer."""
    return (1.0 - 1.0 / T) * rows * heads * (d_q + d_z) * elem_bytes

