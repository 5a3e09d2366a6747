"""The per-request part of a KDA layer: the short convolution over each request's cached inputs
and the gated delta rule through the backend's :class:`~splash_core.platform.interfaces.KDAKernels`.

Works on any requests whose rows are contiguous and in request order (all requests of a step
under TP, the owner's requests under DP, DOP and CP), for any head range, so every layout runs
the same code on a different slice.

Convolution: per request, the c - 1 cached pre-convolution inputs and this step's inputs form
one sequence; output row u is ``sum_t w[t] x[u - (c - 1) + t]`` (PyTorch's causal conv1d with
left padding), then the last c - 1 inputs become the new cache. One gather serves every request:
the cached rows of all requests and the step's rows are concatenated, and :class:`RowPlan`
holds each output's c input rows and each request's new cache rows in that concatenation.

Recurrence: decode requests (one row) go to ``kernels.step`` together; prefill chunks go to
``kernels.chunk`` padded to the longest chunk. Padding sits after each request's last row with
zero k, v, q, log decay 0 and beta 0, which leaves the state exactly as it was
(``S <- 1 * S``, then ``S + 0 k (v - Sᵀ k)ᵀ``), so the final state is the unpadded one.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

from ..model.kda import KDAMath
from ..platform.interfaces import KDAKernels
from .recurrent_pool import LayerRecurrent


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """Host-side index arrays for requests with ``rows[i]`` rows each and a conv of width ``taps + 1``."""

    rows: np.ndarray  # [B] int64, >= 1
    taps: int  # cached inputs per request: conv_size - 1

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.rows)]).astype(np.int64)

    @functools.cached_property
    def row_request(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.rows)), self.rows)

    def _source(self, request: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """Row of (request, offset in this step's rows) in [cached rows of every request; step rows];
        offsets below 0 are cached inputs (-1 the newest)."""
        cached = request * self.taps + self.taps + offset
        fresh = len(self.rows) * self.taps + self.offsets[request] + offset
        return np.where(offset < 0, cached, fresh)

    @functools.cached_property
    def window(self) -> np.ndarray:
        """[n, taps + 1]: the inputs of each output row, oldest first."""
        within = np.arange(int(self.offsets[-1])) - self.offsets[self.row_request]
        t = np.arange(self.taps + 1) - self.taps
        return self._source(self.row_request[:, None], within[:, None] + t[None, :])

    @functools.cached_property
    def tail(self) -> np.ndarray:
        """[B, taps]: each request's new conv cache, oldest first."""
        requests = np.arange(len(self.rows))
        t = np.arange(self.taps) - self.taps
        return self._source(requests[:, None], self.rows[:, None] + t[None, :])

    @functools.cached_property
    def decode(self) -> tuple[np.ndarray, np.ndarray]:
        """(requests with one row, that row)."""
        req = np.flatnonzero(self.rows == 1)
        return req, self.offsets[req]

    @functools.cached_property
    def prefill(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(requests with several rows, their rows, each row's slot in [len(req) * L], L)."""
        req = np.flatnonzero(self.rows > 1)
        if not req.size:
            return req, req, req, 0
        length = int(self.rows[req].max())
        rows = np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in req])
        slots = np.concatenate([b * length + np.arange(self.rows[i]) for b, i in enumerate(req)])
        return req, rows, slots, length


class DeviceRowPlan:
    """A :class:`RowPlan`'s index tensors on the device (built once per step and ownership)."""

    def __init__(self, plan: RowPlan, device):
        t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=torch.int64, device=device)  # noqa: E731
        self.plan = plan
        self.num_requests, self.num_rows = len(plan.rows), int(plan.offsets[-1])
        self.window, self.tail = t(plan.window.reshape(-1)), t(plan.tail.reshape(-1))
        req, rows = plan.decode
        self.decode = (t(req), t(rows)) if req.size else None
        req, rows, slots, length = plan.prefill
        self.prefill = (t(req), t(rows), t(slots), length) if req.size else None


def recur(kernels: KDAKernels, math: KDAMath, pool: LayerRecurrent, requests, plan: DeviceRowPlan,
          heads: range, conv_taps: torch.Tensor, inputs: torch.Tensor, g: torch.Tensor,
          beta: torch.Tensor) -> torch.Tensor:
    """Run ``requests`` (their state for ``heads`` in ``pool``) over this step's rows and store the
    new state; returns o [n, h, V] in ``inputs``' dtype.

    ``conv_taps`` [h, 3, K, c] of ``heads``; ``inputs`` [n, h, 3, K] pre-convolution q/k/v;
    ``g`` [n, h, K] and ``beta`` [n, h] float32; rows in ``plan`` order."""
    n, h, _, K = inputs.shape
    if plan.num_rows != n:
        raise ValueError(f"{n} rows of inputs for a plan of {plan.num_rows}")
    if n == 0:
        return inputs.new_zeros(0, h, K)
    state, cache = pool.gather(requests, heads)
    B, taps, width = plan.num_requests, plan.plan.taps, h * 3 * K
    seq = torch.cat([cache.reshape(B * taps, width).float(), inputs.reshape(n, width).float()])
    windows = seq.index_select(0, plan.window).view(n, taps + 1, width)
    conv = (windows * conv_taps.reshape(width, taps + 1).t().float()).sum(dim=1).view(n, h, 3, K)
    new_cache = seq.index_select(0, plan.tail).view(B, taps, h, 3, K)
    q, k, v = math.activate(conv, inputs.dtype)
    o = inputs.new_empty(n, h, K)
    new_state = torch.empty_like(state)
    if plan.decode is not None:
        req, rows = plan.decode
        one = lambda x: x.index_select(0, rows).unsqueeze(1)  # noqa: E731
        out, final = kernels.step(one(q), one(k), one(v), one(g), one(beta), state.index_select(0, req), math.scale)
        o.index_copy_(0, rows, out[:, 0].to(o.dtype))
        new_state.index_copy_(0, req, final.float())
    if plan.prefill is not None:
        req, rows, slots, length = plan.prefill

        def padded(x):
            z = x.new_zeros(req.numel() * length, *x.shape[1:])
            return z.index_copy_(0, slots, x.index_select(0, rows)).view(req.numel(), length, *x.shape[1:])

        out, final = kernels.chunk(padded(q), padded(k), padded(v), padded(g), padded(beta),
                                   state.index_select(0, req), math.scale)
        o.index_copy_(0, rows, out.reshape(-1, h, K).index_select(0, slots).to(o.dtype))
        new_state.index_copy_(0, req, final.float())
    pool.scatter(requests, new_state, new_cache)
    return o
