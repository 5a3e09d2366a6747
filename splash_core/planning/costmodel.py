"""The stage-wise cost model of appendix B (Eq 10) for steps that mix prefill chunks and decode rows; Eq 7's
switch time is in :mod:`splash_core.planning.switch_time`, the batch's per-rank loads in
:mod:`splash_core.planning.batch_loads`, the per-layer constants in :mod:`splash_core.planning.layer_costs` and the
shared dense/MoE blocks in :mod:`splash_core.planning.ffn_costs` (all re-exported here: the cost model's public API).

For a layout ℓ and the busiest rank's loads (Table 2, exact for any batch), one attention
layer of each kind costs

    t_proj = max(F_proj / Φ, W_read / β_W)              projections: compute- or weight-read-bound
    t_att  = max(F_att / Φ_att, K_read / β_KV)          attention: compute- or KV-read-bound (Φ_att of
                                                         decode kernels in a pure decode step)
    t_dev  = t_proj + t_att + δ + [R_h − η t_att]+ + R_c δ: collective latency, R = R_h + R_c: bandwidth cost
    t_layer = t_dev + [h_ℓ − η_h t_dev]+                 h_ℓ: host time per layer, η_h: how much hides

R_h is the traffic attention's own work can hide (CP's history exchange and merge, DOP's Eq 4
exchange, with the budgeted fraction η of Eq 10); R_c carries attention's output to the shared
blocks (the O reduction, the rows' gather) and waits for it, so it never hides.

and a step costs t_ℓ = t0 + Σ_layers t_layer + t_ffn, where t_ffn (the dense/MoE blocks,
:mod:`~splash_core.planning.ffn_costs`) is the same in every layout but where MoE rows go by all-to-all
(:mod:`~splash_core.planning.moe_dispatch`); t0 holds the embedding and LM head. θ comes from a hardware
profile, η from the deployment's ``scheduler.overlap``.

What each layout computes (rows N of the step; N_r those rank r owns; heads H):

- TP: head-sharded projections for every row, Q-A, KV-A and the indexer on every row on every
  rank, attention on H/T heads against every history (the latent is shared by all heads, so
  each rank reads every row's keys), the O partial sums all-reduced: N·d·b.
- DP: everything for its own rows; the rows' hidden states are all-gathered for the shared
  blocks: (N − N_r)·d·b.
- DOP: head-sharded projections for every row, Eq 4's exchange of query rows to owners
  N_r·H(1 − 1/T)·d_q·b and outputs back (N − N_r)·(H/T)·d_z·b, attention and the cache-side
  projections at the owner, plus TP's O reduction.
- CP: a decode row is projected on every rank and attends to the keys that rank holds; a prefill
  chunk's rows are projected where their positions live and attend to the whole history; the
  traffic (merge, history or ring, sparse attention's global top-k) is
  :mod:`~splash_core.planning.cp_exchange`'s; prefill rows' hidden states are all-gathered like DP's.

A prefill row that attends expanded (:mod:`~splash_core.planning.attention_forms`, the runtime's
``prefill_attention``) costs its form's work: the absorbed attention time of TP, DP and CP is scaled by the step's
expanded-over-absorbed work (DOP and sparse attention stay absorbed).

With sparse attention (the model's indexer, top-k) a row attends to at most k keys and reads their latents, after
the indexer has scored every visible key (TP scores every row on every rank: the indexer is not among the
head-sharded projections). KDA layers follow the same rules with their own widths, except that CP computes KDA like
DP at the owner, which holds the state (SPLASH's runtime), or, with ``cp_recurrent="positions"`` (a chunked scan, as
the paper's DCU sweeps imply), where a chunk's positions live, handing the state over T − 1 hops.

The host term belongs with t0 and δ: what a real runtime spends per layer outside the modelled stages, measured per
layout by ``splash calibrate``; a profile without it (the paper's, a datasheet's) gives Eq 10 as printed. A runtime
that replays captured graphs for pure decode steps spends no host time per layer there: such a step is charged the
profile's replayed t0 and time per layer (``graph_step_overhead_us``, ``graph_layer_overhead_us``: the gaps between
the graph's kernels, added to t_dev) where the profile has them and the cost model is told decode steps replay
(``decode_graphs``) and the model's decode can be captured at all
(:func:`~splash_core.profiles.graphs.decode_capturable`, the rule the runtime obeys: not with KDA layers; sparse
attention captures); prefill and mixed steps run eagerly. Where the profile also holds the backend's capture terms,
Eq 6's A counts the graphs each layout holds and Eq 7 the re-capture a switch that moves weights needs
(:mod:`~splash_core.planning.graph_costs`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .. import dtypes
from ..layouts import LAYOUTS, Layout, Placement, Primitive
from ..profiles.graphs import GraphConfig, decode_capturable
from ..profiles.hardware import HardwareProfile
from ..profiles.model import LayerKind, ModelProfile
from .attention_forms import MLADims, expanded_requests, form_flops
from .batch_loads import BatchArrays, RankLoads, rank_loads
from .cp_exchange import candidate_bytes, merge_bytes, prefill_exchange_bytes
from .dop_exchange import dop_exchange_bytes, eq4_volume
from .ffn_costs import ffn_costs, ffn_time
from .graph_costs import GraphCosts, decode_bucket
from .layer_costs import KindCosts, kind_costs
from .moe_dispatch import dispatch_rule
from .ownership import layer_indices
from .step_estimates import Estimates, StepTime
from .switch_time import SwitchCost, TransferLaw, exposed_switch_time, layer_transfer_times, switch_cost

__all__ = ["BatchArrays", "RankLoads", "rank_loads", "KindCosts", "kind_costs", "StepTime", "Estimates",
           "CostModel", "weight_fraction", "dop_exchange_bytes", "eq4_volume", "SwitchCost",
           "exposed_switch_time", "layer_transfer_times", "switch_cost"]

GB = 1e9
_I = {layout: i for i, layout in enumerate(LAYOUTS)}  # row of each layout in the stacked arrays
CP_RECURRENT = ("owner", "positions")  # where CP computes a chunk's recurrent (KDA) rows
TP, CP, DP, DOP = (_I[l] for l in (Layout.TP, Layout.CP, Layout.DP, Layout.DOP))


class CostModel:
    """Eq 10 for one deployment: θ from the hardware profile, η per layout, model dims.

    Per-layout constants are computed once here; :meth:`evaluate` then costs every layout
    of a batch in one vectorised pass (the scheduler calls it every step). ``sparse``:
    top-k attention with the model's indexer (None: whenever the model has one)."""

    def __init__(self, model: ModelProfile, hardware: HardwareProfile, T: int, *, page_size: int,
                 compute_dtype: str = "bf16", overlap: Mapping[Layout, float] | None = None,
                 layers: Sequence[int] | None = None, sparse: bool | None = None, decode_graphs: bool = True,
                 graph_buckets: Sequence[int] = GraphConfig().buckets, attention_form: str = "auto",
                 cp_recurrent: str = "owner", moe_dispatch: str = "all_reduce"):
        """``attention_form``: how prefill rows attend (:mod:`~splash_core.planning.attention_forms`); ``cp_recurrent``:
        where CP computes a chunk's KDA rows, ``owner`` or ``positions``; ``moe_dispatch``: how MoE rows reach
        their experts (:mod:`~splash_core.planning.moe_dispatch`)."""
        if cp_recurrent not in CP_RECURRENT:
            raise ValueError(f"cp_recurrent must be one of {', '.join(CP_RECURRENT)} (got {cp_recurrent!r})")
        self.cp_kda_at_positions = cp_recurrent == "positions"
        self.model, self.hardware, self.T, self.page_size = model, hardware, T, page_size
        self.act_bytes = dtypes.nbytes(compute_dtype)
        self.sparse = model.indexer is not None if sparse is None else bool(sparse and model.indexer is not None)
        self.eta = np.array([float((overlap or {}).get(l, 0.0)) for l in LAYOUTS])
        covered = layer_indices(model, layers)
        self._set_layer_costs(covered, attention_form)
        self._set_hardware_rates(hardware)
        self.dispatch = dispatch_rule(moe_dispatch, model, hardware, T, self.act_bytes)
        self.ffn = ffn_costs(model, covered, self.act_bytes, self.dispatch.shared_whole)
        kda = any(model.layer_kinds[i] is LayerKind.KDA for i in covered)
        self.decode_capturable = decode_capturable(kda=kda)
        self._set_graph_terms(hardware, len(covered), decode_graphs and self.decode_capturable, graph_buckets)
        self.transfer_law = (None if hardware.switch_transfer is None else  # Eq 13-14's references
                             TransferLaw(hardware.switch_transfer, model, T, page_size, covered))
        self.frac = np.array([weight_fraction(l, T) for l in LAYOUTS])
        self.weights_bytes = sum(kc.layers * kc.weight_bytes for kc in self.kinds) * self.frac  # W_r per layout
        self.kv_bytes_token = sum(kc.layers * kc.stored_bytes_token for kc in self.kinds)  # k of Eq 1
        self.state_bytes_request = sum(kc.layers * kc.state_bytes_request for kc in self.kinds)

    def _set_layer_costs(self, covered: Sequence[int], attention_form: str) -> None:
        model = self.model
        kinds = [model.layer_kinds[i] for i in covered]
        mla = [i for i in covered if model.layer_kinds[i] is LayerKind.MLA]
        selecting = sum(model.indexer.selects(i) for i in mla) if model.indexer is not None else len(mla)
        share = selecting / len(mla) if mla else 1.0  # GLM-5's shared-indexer layers run no indexer
        self.kinds = tuple(kind_costs(model, k, kinds.count(k), self.act_bytes, self.sparse, share)
                           for k in LayerKind if kinds.count(k))
        self.topk = next((kc.topk for kc in self.kinds if kc.topk is not None), None)
        # sparse attention runs absorbed (as the sparse kernels do); DOP always does
        self.forms = (None if self.sparse or model.mla is None or attention_form == "absorbed"
                      else (attention_form, MLADims.of(model.mla)))

    def _set_hardware_rates(self, h: HardwareProfile) -> None:
        self.flops, self.att_flops = h.matmul_tflops.value * 1e12, h.attention_flops
        self.decode_att_flops = h.decode_attention_flops  # a pure decode step runs the decode kernel
        self.weight_bw, self.kv_bw = h.weight_read_gbps.value * GB, h.kv_read_gbps.value * GB
        self.bw = {Primitive.ALL_GATHER: h.all_gather_gbps.value * GB,
                   Primitive.ALL_TO_ALL: h.all_to_all_gbps.value * GB, "all_reduce": h.all_reduce_gbps.value * GB}
        self.latency = h.collective_latency_us.value * 1e-6 if self.T > 1 else 0.0
        self.overhead = h.step_overhead_us.value * 1e-6
        self.host = np.array([h.layer_overhead_s(l) for l in LAYOUTS])  # h_ℓ (zeros without calibration)
        self.host_list = self.host.tolist()
        self.host_overlap = h.host_overlap_fraction  # η_h

    def _set_graph_terms(self, h: HardwareProfile, n_layers: int, decode_graphs: bool,
                         graph_buckets: Sequence[int]) -> None:
        # pure decode steps replayed from captured graphs: their own t0 and time per layer (``decode_graphs``:
        # the deployment replays them and the model's decode can be captured)
        self.replays = bool(decode_graphs and h.replays_graphs)
        self.graph_overhead = h.graph_step_overhead_us.value * 1e-6 if self.replays else self.overhead
        self.graph_host = np.array([h.graph_layer_overhead_s(l) for l in LAYOUTS])
        # captured graphs: re-capture in a switch (Eq 7) and their memory in A (Eq 6), where the
        # profile says the backend captures and decode steps replay (graphs not off)
        self.graph_costs = GraphCosts.of(h, n_layers, graph_buckets, self.T) if decode_graphs else None
        self.padded_buckets = tuple(graph_buckets) if decode_graphs else ()  # decode steps run padded to these

    @classmethod
    def from_deployment(cls, deployment, cp_recurrent: str = "owner") -> "CostModel":
        """Eq 10 of ``deployment`` as SPLASH's runtime executes it (``cp_recurrent``: see the
        module docstring; the paper's testbed may say otherwise, in its ``disaggregation``)."""
        layers = None if deployment.layers is None else range(deployment.layers)
        return cls(deployment.model, deployment.hardware, deployment.T, page_size=deployment.page_size,
                   compute_dtype=deployment.compute_dtype, overlap=deployment.scheduler.overlap, layers=layers,
                   sparse=deployment.sparse_attention, decode_graphs=deployment.graphs.mode != "off",
                   graph_buckets=deployment.graphs.buckets, attention_form=deployment.prefill_attention,
                   cp_recurrent=cp_recurrent, moe_dispatch=deployment.moe_dispatch)

    def loads(self, x: BatchArrays) -> RankLoads:
        return rank_loads(x, self.T, self.page_size, self.topk)

    def evaluate(self, x: BatchArrays, loads: RankLoads | None = None) -> Estimates:
        """t_ℓ(x; θ) (Eq 10) and per-rank W + K + A (Eq 6) of every layout."""
        ld = loads if loads is not None else self.loads(x)
        q = x.query_rows
        decode_rows = float(len(q) if x.decode else np.count_nonzero(q == 1))
        rows = float(len(q) if x.decode else q.sum())
        replayed = self.replays and decode_rows == rows
        overhead = self.graph_overhead if replayed else self.overhead
        sums = np.zeros((7, len(LAYOUTS)))  # proj, att, latency, comm, exposed, host, total
        layer_s, scratch, costliest = {}, None, np.full(len(LAYOUTS), -1.0)
        proj_cb = att_cb = np.zeros(len(LAYOUTS), dtype=bool)
        form_scale = self._form_scale(x)
        chunked = 0.0 if x.decode else float(np.count_nonzero(q > 1))  # requests prefilling a chunk
        candidates = self.cp_candidate_bytes(x, ld)
        scored = self.scored_pairs(x, ld)
        for kc in self.kinds:
            t_proj, p_cb = self._projections(kc, ld)
            t_att, a_cb = self._attention(kc, ld, self.decode_att_flops if decode_rows == rows else self.att_flops,
                                          form_scale, scored)
            hideable, carried, collectives = self._communication(kc, ld, rows, decode_rows, chunked, candidates)
            comm = hideable + carried
            exposed = np.maximum(0.0, hideable - self.eta * t_att) + carried
            t_lat = collectives * self.latency
            t_dev = t_proj + t_att + t_lat + exposed
            t_host = self.graph_host if replayed else np.maximum(0.0, self.host - self.host_overlap * t_dev)
            layer_s[kc.kind] = t_layer = t_dev + t_host
            sums += kc.layers * np.stack([t_proj, t_att, t_lat, comm, exposed, t_host, t_layer])
            costlier = kc.layers * t_layer > costliest  # report the bounds of the costliest kind
            costliest = np.where(costlier, kc.layers * t_layer, costliest)
            proj_cb, att_cb = np.where(costlier, p_cb, proj_cb), np.where(costlier, a_cb, att_cb)
            kind_scratch = self._scratch(kc, ld, decode_rows, candidates)
            scratch = kind_scratch if scratch is None else np.maximum(scratch, kind_scratch)
        if self.graph_costs is not None:  # the graphs each layout holds, on every rank
            scratch = scratch + self.graph_costs.held_bytes(x)[:, None]
        ffn = (ffn_time(self.ffn, rows, self.T, self.flops, self.weight_bw, self.bw["all_reduce"], self.latency)
               - self.ffn.moe_layers * self.dispatch.savings(0.0 if replayed else rows))  # replays all-reduce
        memory = (self.weights_bytes[:, None] + ld.reserved_pages * (self.page_size * self.kv_bytes_token)
                  + ld.state_requests * self.state_bytes_request + scratch)
        proj, att, lat, comm, exposed, host, total = sums
        return Estimates(total + overhead + ffn, overhead, proj, att, lat, comm, exposed, host, ffn,
                         layer_s, proj_cb, att_cb, memory, scratch)

    def step_time(self, layout: Layout, x: BatchArrays) -> StepTime:
        return self.evaluate(x).step_time(layout)

    def scored_pairs(self, x: BatchArrays, loads: RankLoads | None = None) -> np.ndarray:
        """[layouts, T]: (row, key) pairs the indexer scores per MLA layer that selects, on each rank
        (TP: every pair on every rank, the indexer is not head-sharded); none where no context of
        batch ``x`` exceeds k (the runtime then attends densely) or without sparse attention."""
        q = x.query_rows
        if self.topk is None or int(x.contexts[q > 0].max(initial=0)) <= self.topk:
            return np.zeros((len(LAYOUTS), self.T))
        scored = (loads if loads is not None else self.loads(x)).pairs.copy()
        scored[TP] *= self.T
        return scored

    def cp_candidate_bytes(self, x: BatchArrays, loads: RankLoads | None = None) -> float:
        """Bytes each CP rank receives per MLA layer of batch ``x`` in sparse attention's exchange of
        top-k candidates, as Eq 10 charges them (:mod:`~splash_core.planning.cp_exchange`): for the
        rows attended over the keys each rank holds (decode rows; prefill rows where the ring is
        cheaper than gathering the history, with which a rank selects alone). A decode step that
        replays a graph exchanges its padded rows: T x its bucket."""
        q = x.query_rows
        per_row = candidate_bytes(self.T, 1.0, self.topk, int(x.contexts[q > 0].max(initial=0)))
        mla = next((kc for kc in self.kinds if kc.kind is LayerKind.MLA), None)
        if not per_row or mla is None:
            return 0.0
        bucket = decode_bucket(self.padded_buckets, x, self.T) if x.decode else None
        padded = float(self.T * bucket) if bucket else None
        decode_rows = padded or float(len(q) if x.decode else np.count_nonzero(q == 1))
        rows = padded or float(len(q) if x.decode else q.sum())
        return per_row * self._cp_partial_rows(mla, loads if loads is not None else self.loads(x), rows, decode_rows)

    # ---- stages of one layer, every layout at once ([layouts] at the busiest rank) -----

    def _projections(self, kc: KindCosts, ld: RankLoads) -> tuple[np.ndarray, np.ndarray]:
        rows = self._cp_kda_rows(kc, ld)
        cache_rows = rows.copy()
        cache_rows[DOP] = ld.own_rows[DOP]  # DOP writes (and indexes) only its own rows' cache
        flops = (rows * (self.frac[:, None] * kc.flops_row_sharded + kc.flops_row_query)
                 + cache_rows * kc.flops_row_owner)
        compute = flops.max(axis=1) / self.flops
        read = np.where(rows.max(axis=1) > 0, (self.frac * kc.weight_bytes + kc.replicated_bytes) / self.weight_bw, 0.0)
        return np.maximum(compute, read), compute >= read

    def _cp_kda_rows(self, kc: KindCosts, ld: RankLoads) -> np.ndarray:
        """Rows through each rank's projections; a KDA layer's CP rows at the owner, which
        holds the state, unless CP computes them where their positions live."""
        rows = ld.proj_rows
        if kc.kind is LayerKind.KDA and not self.cp_kda_at_positions:
            rows = rows.copy()
            rows[CP] = ld.own_rows[CP]
        return rows

    def _form_scale(self, x: BatchArrays) -> np.ndarray:
        """Per layout, the MLA attention work of the forms the runtime's prefill rows attend in over
        that of the absorbed form (:func:`~splash_core.planning.attention_forms.form_flops`, expansion and
        absorption included; both priced at the attention rate): 1 for decode steps and DOP."""
        scale = np.ones(len(LAYOUTS))
        if self.forms is None or x.decode:
            return scale
        form, dims = self.forms
        rows = x.query_rows
        absorbed, expanded = form_flops(dims, rows, np.where(rows > 0, x.contexts, 0))
        chosen = expanded_requests(form, dims, rows, x.contexts)
        total = float(absorbed[rows > 0].sum())
        if total > 0:
            scale[[TP, DP, CP]] = float(np.where(chosen, expanded, absorbed)[rows > 0].sum()) / total
        return scale

    def _attention(self, kc: KindCosts, ld: RankLoads, att_flops: float, form_scale: np.ndarray,
                   scored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Busiest rank's attention compute (at ``att_flops``: the decode kernel's rate in a pure
        decode step, the prefill kernel's otherwise, since a mixed step's pairs are mostly its
        chunks'; MLA's scaled by ``form_scale`` for the forms prefill attends in) and read time
        per layout (each may peak on a different rank; Eq 10 takes the larger). ``scored``: the
        indexer's pairs per rank (:meth:`scored_pairs`; none: every key attended, unscored)."""
        if kc.kind is LayerKind.MLA:
            compute = (ld.sparse_pairs * (kc.flops_pair / att_flops)).max(axis=1) * form_scale
            if kc.flops_index_pair and scored.any():
                compute = compute + (scored * (kc.flops_index_pair / self.flops)).max(axis=1)
                read_rows = ld.sparse_pairs.copy()
                read_rows[TP] *= self.T  # a TP rank reads the selected latents of every row
                index_reads = ld.kv_tokens * (kc.index_bytes_token * kc.index_share)
                memory = (read_rows * kc.kv_bytes_token + index_reads) / self.kv_bw
            else:
                memory = ld.kv_tokens * (kc.kv_bytes_token / self.kv_bw)
        else:  # KDA: recurrent update per row (TP: its head share), state read and written once
            rows = ld.own_rows
            if self.cp_kda_at_positions:
                rows = rows.copy()
                rows[CP] = ld.proj_rows[CP]
            compute = (rows * (kc.flops_row_state / self.flops)).max(axis=1)
            memory = ld.state_requests * (2.0 * kc.state_bytes_request / self.kv_bw)
        memory = memory.max(axis=1)
        return np.maximum(compute, memory), compute >= memory

    def _communication(self, kc: KindCosts, ld: RankLoads, n: float, decode_rows: float, chunked: float,
                       candidates: float):
        """R of one layer (seconds at the busiest rank) per layout, in two parts: what may hide
        behind attention (η of Eq 10: CP's history exchange and merge, DOP's Eq 4 exchange) and
        what attention waits for or what carries its output to the shared blocks and so cannot
        (CP's top-k ``candidates`` bytes, TP's and DOP's O reduction, DP's and CP's row gather,
        CP's KDA state hand-off); and the collective count."""
        T = self.T
        zeros = np.zeros(len(LAYOUTS))
        if T == 1:
            return zeros, zeros.copy(), zeros.copy()
        b, hidden = self.act_bytes, self.model.hidden_size * self.act_bytes
        own = ld.own_rows[DOP]
        own_min, own_max = float(own.min()), float(own.max())
        gather, a2a, reduce = (self.bw[p] for p in (Primitive.ALL_GATHER, Primitive.ALL_TO_ALL, "all_reduce"))
        reduce_o = n * hidden / reduce
        rows_gather = (n - own_min) * hidden / gather
        # dop_exchange_bytes peaks at the owner of the most rows (to it) and of the fewest (from it)
        to_owner = own_max * kc.heads * (1.0 - 1.0 / T) * kc.width_to_owner * b
        from_owner = (n - own_min) * (kc.heads / T) * kc.width_from_owner * b
        if kc.kind is LayerKind.KDA and self.cp_kda_at_positions and n > decode_rows:
            mine = ld.proj_rows[CP] - decode_rows  # the chunk rows whose positions each rank holds
            handoff = (T - 1) * chunked * kc.state_bytes_request  # each chunked request's state, rank to rank
            cp_rows = ((n - decode_rows - float(mine.min())) * hidden + handoff) / gather
            cp_exchange, cp_count = 0.0, T
        elif kc.kind is LayerKind.KDA:
            cp_exchange, cp_rows, cp_count = 0.0, rows_gather, 1
        else:
            cp_exchange, cp_rows, cp_count = self._cp_traffic(kc, ld, n, decode_rows)
            if candidates:  # attention waits for the global top-k (on the layers that select): nothing hides it
                cp_rows, cp_count = cp_rows + kc.index_share * candidates / gather, cp_count + kc.index_share
        hideable, carried, counts = zeros, zeros.copy(), zeros.copy()
        hideable[[CP, DOP]] = cp_exchange, (to_owner + from_owner) / a2a
        carried[[TP, CP, DP, DOP]] = reduce_o, cp_rows, rows_gather, reduce_o
        counts[[TP, CP, DP, DOP]] = 1, cp_count, 1, 3
        return hideable, carried, counts

    def _cp_traffic(self, kc: KindCosts, ld: RankLoads, n: float, decode_rows: float) -> tuple[float, float, int]:
        """CP's traffic in one MLA layer (:mod:`~splash_core.planning.cp_exchange`): the history
        exchange and LSE merge, the prefill rows' gather (seconds), and the collective count."""
        b, gather = self.act_bytes, self.bw[Primitive.ALL_GATHER]
        merge = merge_bytes(self.T, decode_rows, kc.heads, kc.width_from_owner, b)
        prefill_rows = n - decode_rows
        if prefill_rows <= 0:
            return merge / gather, 0.0, 1
        exchange = float(self._cp_exchange_bytes(kc, ld, decode_rows).max())
        mine = ld.proj_rows[CP] - decode_rows  # the chunk rows whose positions each rank holds
        rows = (prefill_rows - float(mine.min())) * self.model.hidden_size * b
        return (merge + exchange) / gather, rows / gather, (1 if decode_rows else 0) + 2

    def _cp_history_ring(self, kc: KindCosts, ld: RankLoads, decode_rows: float) -> tuple[np.ndarray, np.ndarray]:
        return prefill_exchange_bytes(ld.remote_tokens[CP], kc.stored_bytes_token, self.T,
                                      ld.proj_rows[CP] - decode_rows, kc.heads, kc.width_to_owner,
                                      kc.width_from_owner, self.act_bytes)

    def _cp_exchange_bytes(self, kc: KindCosts, ld: RankLoads, decode_rows: float) -> np.ndarray:
        return np.minimum(*self._cp_history_ring(kc, ld, decode_rows))

    def _cp_partial_rows(self, kc: KindCosts, ld: RankLoads, n: float, decode_rows: float) -> float:
        """Rows CP attends over the keys each rank holds: decode rows, and prefill rows where the
        ring is cheaper than gathering the history on some rank (a rank with the whole history selects alone)."""
        if n <= decode_rows:
            return decode_rows
        history, ring = self._cp_history_ring(kc, ld, decode_rows)
        return n if bool((ring < history).any()) else decode_rows

    def _scratch(self, kc: KindCosts, ld: RankLoads, decode_rows: float, candidates: float) -> np.ndarray:
        """A of Eq 6 per layout and rank: one layer's activations on the heads each rank
        computes (TP and DOP's projections cover H/T heads), DOP's owner rows on all heads,
        and CP's gathered history, partial outputs and top-k candidates (all T ranks')."""
        rows = self._cp_kda_rows(kc, ld)
        out = kc.scratch_bytes(rows, self.frac[:, None])
        out[DOP] += ld.own_rows[DOP] * kc.heads * kc.head_bytes_row
        if kc.kind is LayerKind.MLA and self.T > 1:
            out[CP] += self._cp_exchange_bytes(kc, ld, decode_rows)
            out[CP] += merge_bytes(self.T, decode_rows, kc.heads, kc.width_from_owner, self.act_bytes)
            out[CP] += candidates * self.T / (self.T - 1)
        return out


def weight_fraction(layout: Layout, T: int) -> float:
    return 1.0 / T if layout.placement is Placement.SHARDED else 1.0
