"""The activation exchanges of the layouts, over the backend's collectives.

Rows are in :class:`~splash_core.runtime.step_batch.StepBatch` order (owner-major), so rank r's
rows are one slice and every split size is known to every rank without a metadata exchange.
Every function is a collective: all ranks call it, ranks with zero rows included (paper
appendix E: "ranks that own no rows in a batch still enter both collectives").
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .step_context import StepContext


def gather_rows(step: StepContext, local: torch.Tensor) -> torch.Tensor:
    """Every rank's owner rows [n_r, ...] -> all rows [N, ...] in batch order, on every rank.

    An all-gather, padded to the largest owner's row count and followed by a selection of the
    real rows when owners hold different counts: the gather DP-attention engines do before the
    dense part. Pad rows are never read, so they are left unset."""
    width = int(step.batch.owner_rows.max())
    tail = local.shape[1:]
    flat = local.reshape(local.shape[0], int(np.prod(tail)))
    out = flat.new_empty(step.T * width, flat.shape[1])
    if step.gather_index is None:  # every rank owns `width` rows: the gather is in batch order
        step.collectives.all_gather_into(out, flat)
        return out.view(-1, *tail)
    padded = flat.new_empty(width, flat.shape[1])
    padded[: flat.shape[0]] = flat
    step.collectives.all_gather_into(out, padded)
    return out.index_select(0, step.gather_index).view(-1, *tail)


def rows_to_owners(step: StepContext, q: torch.Tensor) -> torch.Tensor:
    """DOP, before attention: [N, H/T, W] (all rows, this rank's heads) -> [N_r, H, W] (own rows, all heads).

    Rank p's head shard arrives as heads ``[p H/T, (p + 1) H/T)``, so the result is in global head order."""
    n, h, w = q.shape
    T, mine = step.T, step.num_own_rows
    out = q.new_empty(T * mine, h * w)
    step.collectives.all_to_all(out, q.reshape(n, h * w), [mine] * T, step.owner_splits)
    return out.view(T, mine, h, w).transpose(0, 1).reshape(mine, T * h, w)


def owners_to_rows(step: StepContext, out_own: torch.Tensor) -> torch.Tensor:
    """DOP, after attention: [N_r, H, W] (own rows, all heads) -> [N, H/T, W] (all rows, this rank's heads)."""
    mine, heads, w = out_own.shape
    T = step.T
    h = heads // T
    send = out_own.view(mine, T, h, w).transpose(0, 1).reshape(T * mine, h * w)
    out = out_own.new_empty(step.batch.num_rows, h * w)
    step.collectives.all_to_all(out, send, step.owner_splits, [mine] * T)
    return out.view(-1, h, w)


def reduce_to_owners(step: StepContext, partial: torch.Tensor) -> torch.Tensor:
    """DOP's partial outputs of all rows [N, d] (this rank's heads) -> each owner's rows summed over
    ranks [N_r, d]: half an all-reduce (a reduce-scatter by owner), in one all-to-all."""
    T, mine = step.T, step.num_own_rows
    out = partial.new_empty(T * mine, partial.shape[1])
    step.collectives.all_to_all(out, partial.contiguous(), [mine] * T, step.owner_splits)
    return out.view(T, mine, partial.shape[1]).sum(0)


def pack_rows(parts) -> torch.Tensor:
    """Row-aligned tensors of any formats side by side as bytes [n, total bytes], to travel in one collective."""
    return torch.cat([p.reshape(p.shape[0], math.prod(p.shape[1:])).contiguous().view(torch.uint8) for p in parts],
                     dim=1)


def unpack_rows(packed: torch.Tensor, formats) -> list[torch.Tensor]:
    """:func:`pack_rows`' parts of ``packed`` [n, bytes], each ``(dtype, width)`` of ``formats`` as
    [n, width]: read in place (strided views) where its columns start and its rows repeat on a
    multiple of its format's size, else copied out first."""
    out, at = [], 0
    for dtype, width in formats:
        size = dtype.itemsize
        part = packed[:, at: at + width * size]
        if at % size or packed.shape[1] % size:
            part = part.contiguous()
        out.append(part.view(dtype))
        at += width * size
    return out


def partials_to_owners(step: StepContext, out: torch.Tensor, lse: torch.Tensor):
    """CP, after attention: every rank's partial (out [N, H, W], lse [N, H] fp32) of every row ->
    each owner's T partials of its rows (outs [T, N_r, H, W], lses [T, N_r, H]), in one all-to-all,
    ``out`` and ``lse`` side by side as bytes (so their formats may differ); the merge takes any
    strides with a unit channel stride."""
    n, heads, w = out.shape
    T, mine = step.T, step.num_own_rows
    payload = pack_rows([out, lse.float()])
    recv = payload.new_empty(T * mine, payload.shape[1])
    step.collectives.all_to_all(recv, payload, [mine] * T, step.owner_splits)
    outs, lses = unpack_rows(recv, [(out.dtype, heads * w), (torch.float32, heads)])
    return outs.view(T, mine, heads, w), lses.view(T, mine, heads)
