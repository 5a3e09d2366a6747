"""One KDA layer on one rank, computing in its own current layout (the KDA counterpart of
:class:`~splash_core.runtime.mla_layer.MLALayer`, same contract).

Contract of :meth:`KDALayer.forward`: input ``x`` [N, d] is the normalised hidden state of all
rows of the step, the same on every rank; the output [N, d] is the attention output of all
rows, the same on every rank. The recurrent state of a request lives where
:func:`~splash_core.runtime.recurrent_pool.held_heads` says; per layout:

- TP: this rank's heads for all rows, with this rank's head shard of every request's state;
  O partials all-reduced.
- DP and CP: all heads for the owner's rows with the owner's whole state, no attention
  communication; the owners' outputs are all-gathered. (CP splits KV by position; a recurrence
  has no position axis, so its state stays whole on the owner and CP computes like DP.)
- DOP: this rank's heads for all rows (q/k/v before the convolution, log decay, beta); a
  variable all-to-all sends each row's heads to its owner (``exchange.rows_to_owners``, the MLA
  DOP exchange), which convolves and runs the recurrence for all heads with its whole state;
  the reverse all-to-all returns head slices; gated norm and sharded O; an all-reduce sums the
  O partials of all rows.

A request is admitted to the layer (zero state on the ranks that hold it) at its first step
(start 0); a later step of a request whose state is missing here is an error naming it.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from ..layouts import Layout
from ..model.kda import KDAMath, KDAWeights
from ..model.weights import HeadShardedLayer
from ..platform.interfaces import KDAKernels
from . import exchange
from .kda_recurrence import DeviceRowPlan, RowPlan, recur
from .recurrent_pool import LayerRecurrent, held_heads
from .step_context import StepContext

# Row plans are a property of the step and of which requests a rank runs (all, or the ones it
# owns), so every KDA layer of a step shares them: built once, dropped with the step.
_PLANS: "weakref.WeakKeyDictionary[StepContext, dict]" = weakref.WeakKeyDictionary()


def _requests(step: StepContext, everyone: bool, taps: int) -> tuple[list[int], DeviceRowPlan, np.ndarray]:
    """(request ids, row plan, starts) of all requests of the step or of this rank's own."""
    plans = _PLANS.setdefault(step, {})
    if (everyone, taps) not in plans:
        b = step.batch
        sel = np.arange(len(b)) if everyone else b.owned_requests(step.rank)
        plans[everyone, taps] = ([int(i) for i in b.ids[sel]], DeviceRowPlan(RowPlan(b.rows[sel], taps), step.device),
                                 b.starts[sel])
    return plans[everyone, taps]


class KDALayer(HeadShardedLayer):
    """Layout, weights and recurrent state of one KDA layer on one rank."""

    def __init__(self, index: int, layout: Layout, weights: KDAWeights, state: LayerRecurrent, math: KDAMath,
                 kernels: KDAKernels, rank: int, T: int):
        self.index = index
        self.math, self.kernels = math, kernels
        self.state = state
        self.rank, self.T = rank, T
        self.layout: Layout
        self.weights: KDAWeights
        self.set_layout(layout, weights)

    def nbytes(self) -> dict[str, int]:
        return {**self.weights.nbytes(), **self.state.nbytes()}

    def held_heads(self, owner: int) -> range | None:
        """Heads of a request owned by ``owner`` this layer's layout puts on this rank."""
        return held_heads(self.layout, owner, self.rank, self.T, self.weights.total_heads)

    # ---- forward --------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, step: StepContext) -> torch.Tensor:
        return _FORWARD[self.layout](self, x, step)

    def _run(self, step: StepContext, everyone: bool, heads: range, inputs, g, beta) -> torch.Tensor:
        """Admit the step's new requests, then run the recurrence of the step's requests (all of
        them, or this rank's own) for ``heads``: o [n, h, V]."""
        ids, plan, starts = _requests(step, everyone, self.math.conv_size - 1)
        for rid, start in zip(ids, starts):
            if start == 0:
                self.state.admit(rid, heads)
        taps = self.weights.conv[heads.start: heads.stop]
        return recur(self.kernels, self.math, self.state, ids, plan, heads, taps, inputs, g, beta)

    def _tp(self, x, step):
        m, w = self.math, self.weights
        o = self._run(step, True, w.heads, m.inputs(w, x), m.decay(w, x), m.beta(w, x))
        out = m.output(w, x, o)
        step.collectives.all_reduce(out)
        return out

    def _owner(self, x, step):
        """DP and CP: the owner's rows with all heads."""
        m, w = self.math, self.weights
        xr = x[step.own_rows]
        o = self._run(step, False, w.heads, m.inputs(w, xr), m.decay(w, xr), m.beta(w, xr))
        return exchange.gather_rows(step, m.output(w, xr, o))

    def _dop(self, x, step):
        m, w = self.math, self.weights
        inputs = m.inputs(w, x)  # [N, H/T, 3, K]: this rank's heads, all rows
        payload, unpack = _per_head_bytes(inputs, m.decay(w, x), m.beta(w, x))
        own_inputs, own_g, own_beta = unpack(exchange.rows_to_owners(step, payload))  # own rows, all heads
        o_own = self._run(step, False, range(w.total_heads), own_inputs, own_g, own_beta)
        o = exchange.owners_to_rows(step, o_own)  # [N, H/T, V]
        out = m.output(w, x, o)
        step.collectives.all_reduce(out)
        return out


def _per_head_bytes(inputs: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
    """Pack a row's per-head inputs [n, h, 3, K] (compute format), g [n, h, K] and beta [n, h]
    (float32) side by side as bytes [n, h, W], so one all-to-all moves them in their own
    formats; returns (payload, unpack) where unpack turns [m, H, W] back into the three."""
    n, h, _, K = inputs.shape
    parts = [inputs.reshape(n, h, 3 * K), g.float(), beta.float().unsqueeze(-1)]
    raw = [p.contiguous().view(torch.uint8) for p in parts]
    edges = np.cumsum([0] + [r.shape[-1] for r in raw])

    def unpack(received: torch.Tensor):
        m, heads = received.shape[:2]
        cut = [received[..., a:b].contiguous() for a, b in zip(edges[:-1], edges[1:])]
        return (cut[0].view(inputs.dtype).view(m, heads, 3, K), cut[1].view(torch.float32),
                cut[2].view(torch.float32).view(m, heads))

    return torch.cat(raw, dim=-1), unpack


_FORWARD = {Layout.TP: KDALayer._tp, Layout.DP: KDALayer._owner, Layout.DOP: KDALayer._dop, Layout.CP: KDALayer._owner}
