"""The stage-wise cost model of appendix B (Eq 10), each layout's own traffic (Eq 4 and
friends) and the exposed switch time of Eq 7.

For a layout ℓ and the busiest rank's loads (Table 2, exact for any batch via
:mod:`splash_core.loads`; :func:`rank_loads` is the vectorised equivalent the scheduler uses),
one layer of each kind costs

    t_proj = max(F_proj / Φ, W_read / β_W)          projections: compute- or weight-read-bound
    t_att  = max(F_att / Φ, K_read / β_KV)          attention: compute- or KV-read-bound
    t_layer = t_proj + t_att + δ + [R − η t_att]+    δ: collective latency, R: bandwidth cost

and a step costs t_ℓ = t0 + Σ_layers t_layer (Eq 10 summed over the layers). θ comes from a
hardware profile, η from the deployment's ``scheduler.overlap``.

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
same in every layout and is not modelled (it cancels in the argmin of Eq 8).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

import numpy as np

from . import dtypes, weights
from .layouts import LAYOUTS, Layout, Placement, Primitive
from .ownership import Batch, Request, cp_prefix_matrix, layer_indices
from .profiles.hardware import HardwareProfile
from .profiles.model import LayerKind, ModelProfile

GB = 1e9
_LSE_BYTES = 4  # one fp32 log-sum-exp per row and head
_I = {layout: i for i, layout in enumerate(LAYOUTS)}  # row of each layout in the stacked arrays


@dataclasses.dataclass(frozen=True)
class BatchArrays:
    """A step's running requests as arrays: what the scheduler evaluates every step.

    ``reserved`` is the KV each request may reach (context plus the output it may still
    generate): Eq 6 checks it, so an admitted batch keeps fitting as it decodes. A request
    with 0 query rows (waiting for prefill budget) holds KV but costs no compute or reads."""

    contexts: np.ndarray  # s_i, including this step's query rows
    query_rows: np.ndarray  # q_i ≤ s_i: chunk rows in prefill, 1 in decode
    owners: np.ndarray
    ids: np.ndarray
    reserved: np.ndarray
    decode: bool = False  # every request has one query row (set by :meth:`of`)

    @classmethod
    def of(cls, contexts, owners, *, query_rows=None, ids=None, reserved=None) -> "BatchArrays":
        s = np.asarray(contexts, dtype=np.int64)
        q = np.ones_like(s) if query_rows is None else np.minimum(np.asarray(query_rows, dtype=np.int64), s)
        ids = np.arange(len(s), dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
        res = s if reserved is None else np.maximum(np.asarray(reserved, dtype=np.int64), s)
        return cls(s, q, np.asarray(owners, dtype=np.int64), ids, res, bool((q == 1).all()))

    @classmethod
    def from_batch(cls, batch: Batch, reserved=None) -> "BatchArrays":
        return cls.of(batch.contexts, batch.owners, ids=batch.ids, reserved=reserved,
                      query_rows=[r.query_rows for r in batch.requests])

    def to_batch(self) -> Batch:
        return Batch(tuple(Request(int(i), int(s), int(o), int(q)) for i, s, o, q in
                           zip(self.ids, self.contexts, self.owners, self.query_rows)))

    def __len__(self) -> int:
        return len(self.contexts)


@dataclasses.dataclass(frozen=True)
class RankLoads:
    """Per-rank loads of every layout for one step: each array is [len(LAYOUTS), T], row i
    for ``LAYOUTS[i]`` (Table 2's quantities per layer, exact for any batch)."""

    proj_rows: np.ndarray  # rows through the rank's projections (on 1/T of the heads if sharded)
    own_rows: np.ndarray  # rows of the requests the rank owns (TP: N/T, its head share)
    kv_tokens: np.ndarray  # history tokens held and read per MLA layer
    pairs: np.ndarray  # causal (row, key) pairs per MLA layer, all-head units (TP: 1/T of them)
    reserved_pages: np.ndarray  # pages Eq 6 reserves per MLA layer
    state_requests: np.ndarray  # requests' worth of KDA state held (TP: B/T)

    def of(self, layout: Layout) -> dict[str, np.ndarray]:
        i = LAYOUTS.index(layout)
        return {f.name: getattr(self, f.name)[i] for f in dataclasses.fields(self)}


def rank_loads(x: BatchArrays, T: int, page_size: int) -> RankLoads:
    """Every layout's per-rank loads, vectorised with a handful of O(B) bincounts (the
    scheduler's per-step path). Equal to :func:`splash_core.loads.loads` (tested)."""
    s, q, owners, P = x.contexts, x.query_rows, x.owners, page_size
    B = len(s)
    decode = x.decode
    if not decode:  # a request without rows this step holds its KV (Eq 6) but reads none
        s = np.where(q > 0, s, 0)
    pairs_i = s if decode else q * s - q * (q - 1) // 2
    pages_res = (x.reserved + (P - 1)) // P
    out = np.empty((6, len(LAYOUTS), T))
    proj, own, tokens, pairs, reserved, state = out
    n_rows = float(B if decode else q.sum())
    # request-owned layouts (DP, DOP) and what CP keeps on owners (KDA state)
    dp, dop, cp, tp = _I[Layout.DP], _I[Layout.DOP], _I[Layout.CP], _I[Layout.TP]
    held = np.bincount(owners, minlength=T)
    own[dp] = held if decode else np.bincount(owners, q, minlength=T)
    own[dop] = own[cp] = own[dp]
    tokens[dp] = np.bincount(owners, s, minlength=T)
    tokens[dop] = tokens[dp]
    pairs[dp] = pairs[dop] = tokens[dp] if decode else np.bincount(owners, pairs_i, minlength=T)
    reserved[dp] = np.bincount(owners, pages_res, minlength=T)
    reserved[dop] = reserved[dp]
    state[dp] = state[dop] = state[cp] = held
    # TP: every rank holds and reads everything, computes 1/T of the heads
    own[tp] = n_rows / T
    tokens[tp] = float(s.sum())
    pairs[tp] = float(pairs_i.sum()) / T
    reserved[tp] = float(pages_res.sum())
    state[tp] = B / T
    proj[:] = n_rows
    proj[dp] = own[dp]
    # CP: page p of request i lives on rank (p + i) mod T (ownership.cp_rank_of_page)
    if B:
        start = x.ids % T
        full, part = np.divmod(s, P)
        base, extra = np.divmod(full, T)
        rbase, rextra = np.divmod(pages_res, T)
        windows = _window_counts(start, (extra, rextra), T)
        tokens[cp] = P * float(base.sum()) + P * windows[0] + np.bincount((start + extra) % T, part, minlength=T)
        reserved[cp] = float(rbase.sum()) + windows[1]
        pairs[cp] = tokens[cp] if decode else _cp_pairs(s, q, x.ids, T, P)
    else:
        tokens[cp] = reserved[cp] = pairs[cp] = 0.0
    return RankLoads(proj, own, tokens, pairs, reserved, state)


def _window_counts(start: np.ndarray, lengths: tuple[np.ndarray, ...], T: int) -> list[np.ndarray]:
    """For each set of lengths (each < T) and rank r: how many requests' circular windows
    [start, start + length) mod T contain r. A histogram of (start, length) pairs times a
    constant T² x T incidence matrix: two numpy calls per set."""
    incidence = _incidence(T)
    key = start * T
    return [np.bincount(key + length, minlength=T * T) @ incidence for length in lengths]


@functools.lru_cache(maxsize=None)
def _incidence(T: int) -> np.ndarray:
    """[(start, length), rank] -> 1 if rank lies in the circular window [start, start + length)."""
    s, e, r = np.meshgrid(np.arange(T), np.arange(T), np.arange(T), indexing="ij")
    return (((r - s) % T) < e).reshape(T * T, T).astype(np.float64)


def _cp_pairs(s, q, ids, T: int, P: int) -> np.ndarray:
    """CP pairs per rank in prefill: keys below s − q are seen by all q rows, a key at t ≥ s − q
    by the s − t rows at or after it (splash_core.loads._cp_tokens_and_pairs)."""
    f_s, g_s = cp_prefix_matrix(s, ids, T, P)
    f_c, g_c = cp_prefix_matrix(s, ids, T, P, upto=np.maximum(s - q, 0))
    return (q[:, None] * f_c + s[:, None] * (f_s - f_c) - (g_s - g_c)).sum(axis=0).astype(np.float64)


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
    layer_s: Mapping[LayerKind, float]  # one layer of each kind (Eq 7's per-layer compute)
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
                        {k: float(v[i]) for k, v in self.layer_s.items()},
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
        # rows: proj, att, lat, comm, exposed, total (then per-kind layer times), per layout
        sums = [[0.0] * n_layouts for _ in range(6)]
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
                layer[i] = t = t_proj + t_att + t_lat + t_exp
                for row, value in zip(sums, (t_proj, t_att, t_lat, comm[i], t_exp, t)):
                    row[i] += n_layers * value
                if n_layers * t > costliest[i]:  # report the bounds of the costliest kind
                    costliest[i] = n_layers * t
                    proj_cb[i], att_cb[i] = p_c >= p_m, att_c[i] >= att_m[i]
            layer_s[kc.kind] = layer
        memory = (self.weights_bytes[:, None] + ld.reserved_pages * (self.page_size * self.kv_bytes_token)
                  + ld.state_requests * self.state_bytes_request + scratch)
        sums[5] = [self.overhead + t for t in sums[5]]
        proj, att, lat, comm, exposed, total = np.array(sums)
        return Estimates(total, self.overhead, proj, att, lat, comm, exposed,
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


# ---- Eq 7: exposed switch time ---------------------------------------------------------

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


def layer_transfer_times(manifest, model: CostModel) -> np.ndarray:
    """Per planned layer of a :class:`~splash_core.manifest.Manifest`: the busiest rank's
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


def switch_cost(manifest, model: CostModel, dest: StepTime) -> SwitchCost:
    """Eq 7 for a planned switch, layer i−1 computing in the destination layout (``dest``)."""
    transfer = layer_transfer_times(manifest, model)
    compute = np.array([dest.layer_s.get(layer.kind, 0.0) for layer in manifest.layers])
    return SwitchCost(exposed_switch_time(transfer, compute), float(transfer.sum()),
                      tuple(transfer.tolist()), tuple(compute.tolist()))
