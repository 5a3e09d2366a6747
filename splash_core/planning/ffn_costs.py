"""The part of a step every attention layout shares: the dense/MoE blocks after attention
(DESIGN.md §3.5: they keep one fixed parallelism while attention switches). The embedding and
LM head belong to t0, the fixed time of a step (``splash calibrate`` measures t0 as a step of
the embedding and LM head alone).

Its time is the same in every layout, but it is not zero: leaving it out of Eq 10 leaves the
argmin of Eq 8 alone and inflates every throughput ratio between layouts.

Parallelism (what DP-attention engines run): a dense MLP is tensor-parallel over the T ranks;
routed experts are expert-parallel (E/T experts per rank, tokens balanced over them); shared
experts and the LM head are tensor-parallel. The block takes every row of the step (the
attention layouts deliver their outputs as the rows the block needs; their own traffic is
in :mod:`splash_core.planning.costmodel`) and ends with one all-reduce of the rows' hidden states.

Per rank and layer, with N rows::

    t = max(F / (T Φ), W_read / β_W) + N·d·b / β_AR + δ

where F is the rows' flops, and W_read the weights the rank reads: its dense/shared shard,
and of its E/T routed experts those that some row was routed to (uniform routing: each of
N rows picks k of E experts, so an expert is touched with probability 1 − (1 − k/E)^N).
"""

from __future__ import annotations

import dataclasses

from .. import dtypes
from ..profiles.model import ModelProfile
from .ownership import layer_indices


@dataclasses.dataclass(frozen=True)
class FFNCosts:
    """Constants of the shared blocks of the covered layers, computed once per deployment."""


    dense_layers: int
    moe_layers: int
    dense_flops_row: float  # one dense MLP, one row
    dense_bytes: float  # one dense MLP's weights
    expert_flops_row: float  # one expert, one row
    expert_bytes: float  # one expert's weights
    experts: int  # routed experts per MoE layer (E)
    experts_per_row: int  # k
    shared_experts: int
    hidden_bytes_row: float  # one row's hidden state in the activation format
    shared_whole: bool = False  # every rank holds (and reads) the shared experts whole

    @property
    def layers(self) -> int:
        return self.dense_layers + self.moe_layers


def ffn_costs(model: ModelProfile, layers=None, act_bytes: int = 2, shared_whole: bool = False) -> FFNCosts:
    """The shared blocks of the layers ``layers`` covers (all by default); ``shared_whole``: the shared
    experts held whole on every rank (:mod:`~splash_core.planning.moe_dispatch`), each rank computing
    them for its share of the rows."""
    d, w = model.hidden_size, dtypes.nbytes(model.weight_dtype)
    covered = layer_indices(model, layers)
    moe = model.moe
    moe_layers = sum(1 for i in covered if model.is_moe_layer(i))
    dense_layers = len(covered) - moe_layers if model.intermediate_size else 0
    expert = 3 * d * moe.moe_intermediate_size if moe else 0  # gate, up and down
    dense = 3 * d * model.intermediate_size
    return FFNCosts(dense_layers, moe_layers, 2.0 * dense, float(dense * w), 2.0 * expert, float(expert * w),
                    moe.n_routed_experts if moe else 0, moe.num_experts_per_tok if moe else 0,
                    moe.n_shared_experts if moe else 0, float(d * act_bytes), shared_whole)


def ffn_time(c: FFNCosts, rows: float, T: int, flops: float, weight_bw: float, reduce_bw: float,
             latency: float) -> float:
    """Seconds of the shared blocks for one step of ``rows`` rows at the busiest rank
    (balanced: the same on every rank)."""
    if rows <= 0:
        return 0.0
    reduce = (rows * c.hidden_bytes_row / reduce_bw + latency) if T > 1 else 0.0
    total = 0.0
    if c.dense_layers:
        dense = max(rows * c.dense_flops_row / (T * flops), c.dense_bytes / (T * weight_bw))
        total += c.dense_layers * (dense + reduce)
    if c.moe_layers:
        touched = c.experts / T * (1.0 - (1.0 - c.experts_per_row / c.experts) ** rows)
        compute = rows * (c.experts_per_row + c.shared_experts) * c.expert_flops_row / (T * flops)
        read = (touched + c.shared_experts / (1 if c.shared_whole else T)) * c.expert_bytes / weight_bw
        total += c.moe_layers * (max(compute, read) + reduce)
    return total
