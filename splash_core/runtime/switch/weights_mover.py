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
from ...planning.manifest import StatePlan
from .transfer import Transfer, TransferContext, byte_view

WEIGHTS = State.WEIGHTS


@dataclasses.dataclass
class _Gather:
    name: str
    dim: int  # the axis the shards join along
    pending: object
    out: torch.Tensor  # the gathered tensor, the joined axis first


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
            for name in sorted(w.SHARDED, key=lambda n: -getattr(w, n).numel()):
                x, dim = getattr(w, name), w.SHARD_AXES[name]
                send = x.movedim(dim, 0) if dim else x
                if not send.is_contiguous():
                    send = send.contiguous()
                out = send.new_empty((io.T * send.shape[0], *send.shape[1:]))
                pending = io.all_gather(byte_view(out), byte_view(send), layer=layer.index, state=WEIGHTS)
                gathers.append(_Gather(name, dim, pending, out))
                sent += x.numel() * x.element_size()
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
        w = t.layer.weights
        t.layout_args["weights"] = dataclasses.replace(w, heads=range(w.total_heads), **full)
        t.data = None

    def retire(self, t: Transfer) -> None:
        """Nothing to free by hand: the replaced weights go when the layer drops them."""

    def rollback(self, t: Transfer) -> None:
        t.layout_args.clear()
        t.data = None
