"""Moving a layer's head-indexed projections between placements (paper §4.1, Figure 3 right).

- sharded → replicated (TP/DOP → DP/CP): one all-gather per head-indexed tensor, each straight
  into its full tensor, with no copy on either side. A tensor whose shards concatenate along dim
  0 (Q-B, KV-B: rows per head) is gathered as is. One concatenated along another dim d (O:
  columns per head) is gathered with d moved to the front, i.e. as the transposed tensor, whose
  shards do concatenate along dim 0; the full tensor is that buffer with d moved back, a view
  of the same shape (O comes out column-major, which matmuls take as is). Its shards, cut later
  from such a full tensor, keep that memory order, so they are sent without a copy too; a shard
  in the other order is copied once. The largest tensors go first. They do not go through the
  side collectives' transfer buffers (:meth:`TransferContext.gather_buffer`): a buffer reused
  by the next layer would cost a copy in and out, and on 2 x H200 copy-engine weight gathers
  did not make a weights-only switch faster (bench/results/h200x2/switch_overhead-9ed0e0f.json
  against switch_overhead.json, and switch_trace-3a32392.json, at git 148a7b0).
- kept FP8 (:class:`~splash_core.model.fp8_blocks.StackedFP8`, ``attention_weights: fp8``): the
  e4m3 codes are gathered as bytes the same way, and beside them each rank's scale blocks. A head
  shard (rank r's run of n rows or columns from r n of the whole) may start inside a 128 x 128
  block on small models, so neighbours both hold the block at their boundary and ranks touch
  different numbers of blocks: each sends its blocks padded to the largest count (every rank
  computes every rank's start and count from r, n and the block), and the receiver places them on
  the whole grid (:func:`~splash_core.model.fp8_blocks.joined`), refusing blocks two ranks disagree
  on. What a rank receives is then (T - 1) x (its codes + its padded scales), what Eq 9 counts
  with scales (:mod:`splash_core.planning.weight_bytes`). O's gathered codes are copied once into
  row-major order (the FP8 GEMMs read channels contiguously).
- replicated → sharded: a local slice-and-repack (``shard(rank, T)``): a discard.
- same placement: nothing moves.

Works for any weights object with the interface of :class:`~splash_core.model.mla.MLAWeights`
(and the KDA layer's weights): a dataclass with ``heads``, ``total_heads``, ``is_full``,
``SHARDED`` (the head-indexed tensor names), ``SHARD_AXES`` (the axis each one's shards join
along, which the class's own ``from_shards`` joins them by), ``shard(rank, T)`` and
``from_shards(shards)``. The old weights are freed when the layer takes the new ones
(``set_layout``), i.e. once the transfer landed.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import torch

from ...layouts import Layout, Placement, Primitive, State
from ...model.fp8_blocks import BlockScaledFP8, StackedFP8, blocks_touched, joined
from ...planning.manifest import StatePlan
from .transfer import Transfer, TransferContext, byte_view

WEIGHTS = State.WEIGHTS


@dataclasses.dataclass
class _Gather:
    name: str
    dim: int  # the axis the shards join along
    pending: object
    out: torch.Tensor  # the gathered tensor, the joined axis first
    scales: "_ScaleGather | None" = None  # kept FP8: the scale blocks gathered beside the codes


@dataclasses.dataclass
class _ScaleGather:
    """The scale blocks of an FP8 head shard in flight: every rank's ``counts[r]`` blocks (along the
    joined axis, padded to the largest count) gathered into ``out``."""

    pending: object
    out: torch.Tensor  # [T * max(counts), other blocks]
    counts: list[int]
    own: BlockScaledFP8  # this rank's slice (its block size, its start on the other axis)
    dtype: torch.dtype  # the compute format the weight is used in


class WeightsMover:
    """:class:`~splash_core.runtime.switch.transfer.StateMover` for ``State.WEIGHTS``."""

    states = (WEIGHTS,)

    def start(self, layer, plans: Mapping[State, StatePlan], dst: Layout, io: TransferContext) -> Transfer:
        plan, w = plans[WEIGHTS], layer.weights
        t = Transfer(layer, self.states, {WEIGHTS: str(plan.primitive)}, {WEIGHTS: 0}, {WEIGHTS: 0})
        to_sharded = dst.placement is Placement.SHARDED
        if plan.primitive is Primitive.ALL_GATHER:
            if w.is_full or to_sharded:
                raise ValueError(f"layer {layer.index}: the plan all-gathers weights into {dst}, "
                                 f"but the layer holds heads {w.heads} of {w.total_heads}")
            gathers, sent = [], 0
            for name in sorted(w.SHARDED, key=lambda n: -_elements(getattr(w, n))):
                x, dim = getattr(w, name), w.SHARD_AXES[name]
                codes = x.parts[0].codes if isinstance(x, StackedFP8) else x
                send = codes.movedim(dim, 0) if dim else codes
                if not send.is_contiguous():
                    send = send.contiguous()
                out = send.new_empty((io.T * send.shape[0], *send.shape[1:]))
                pending = io.all_gather(byte_view(out), byte_view(send), layer=layer.index, state=WEIGHTS)
                scales = _gather_scales(x, dim, io, layer.index) if isinstance(x, StackedFP8) else None
                gathers.append(_Gather(name, dim, pending, out, scales))
                sent += codes.numel() * codes.element_size() + (scales.out.numel() // io.T * 4 if scales else 0)
            t.data = gathers
            t.received_bytes[WEIGHTS] = (io.T - 1) * sent
            t.group_bytes[WEIGHTS] = io.T * (io.T - 1) * sent
        elif plan.primitive is Primitive.DISCARD:
            if to_sharded and w.is_full:  # keep this rank's shard, drop the replica
                t.layout_args["weights"] = w.shard(io.rank, io.T)
        else:
            raise ValueError(f"layer {layer.index}: weights move by {plan.primitive}, which no layout pair needs")
        return t

    def finish(self, t: Transfer, io: TransferContext) -> None:
        if not t.data:
            return
        full = {}
        for g in t.data:
            io.wait(g.pending)
            full[g.name] = g.out.movedim(0, g.dim) if g.dim else g.out
            if g.scales is not None:
                io.wait(g.scales.pending)
                full[g.name] = _whole_fp8(full[g.name], g.dim, g.scales)
        w = t.layer.weights
        t.layout_args["weights"] = dataclasses.replace(w, heads=range(w.total_heads), **full)
        t.data = None

    def retire(self, t: Transfer) -> None:
        """Nothing to free by hand: the replaced weights go when the layer drops them."""

    def rollback(self, t: Transfer) -> None:
        t.layout_args.clear()
        t.data = None


def _elements(x: torch.Tensor | StackedFP8) -> int:
    return x.parts[0].codes.numel() if isinstance(x, StackedFP8) else x.numel()


def _gather_scales(x: StackedFP8, dim: int, io: TransferContext, layer: int) -> _ScaleGather:
    """Start gathering the scale blocks of this rank's FP8 head shard ``x`` (joined along ``dim``)."""
    own = x.parts[0]
    n, b = own.codes.shape[dim], own.block[dim]
    if own.start[dim] != (io.rank * n) % b:
        raise ValueError(f"layer {layer}: rank {io.rank}'s FP8 shard starts at {own.start[dim]} of its first block, "
                         f"not where rows {io.rank * n}.. of the whole weight do")
    counts = [blocks_touched((r * n) % b, n, b) for r in range(io.T)]
    mine = own.scales.movedim(dim, 0)
    send = mine.new_zeros((max(counts), *mine.shape[1:]))
    send[: mine.shape[0]] = mine
    out = send.new_empty((io.T * send.shape[0], *send.shape[1:]))
    pending = io.all_gather(out, send, layer=layer, state=WEIGHTS)
    return _ScaleGather(pending, out, counts, own, x.dtype)


def _whole_fp8(codes: torch.Tensor, dim: int, g: _ScaleGather) -> StackedFP8:
    """The whole weight kept FP8 from all ranks' gathered ``codes`` (the joined axis at ``dim``) and
    scale blocks: each rank's blocks placed on one grid, blocks two ranks share checked equal."""
    T, n, b = len(g.counts), codes.shape[dim] // len(g.counts), g.own.block[dim]
    codes = codes.contiguous()  # O's gathered columns: channels contiguous again, as the FP8 GEMMs read them
    per_rank = g.out.view(T, -1, *g.out.shape[1:])
    parts = []
    for r, count in enumerate(g.counts):
        start = list(g.own.start)
        start[dim] = (r * n) % b
        parts.append(BlockScaledFP8(codes.narrow(dim, r * n, n), per_rank[r, :count].movedim(0, dim),
                                    tuple(start), g.own.block))
    return StackedFP8((joined(parts, dim, codes=codes),), g.dtype)
