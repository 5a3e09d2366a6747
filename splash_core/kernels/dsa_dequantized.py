"""Sparse prefill on a scaled-fp8 cache through a copy of its pages in the compute dtype.

A sparse kernel reading the scaled-fp8 format dequantizes every key it gathers, once per program:
a prefill row's 2,048 selected keys are gathered again for every block of heads and by every row
of the request that selects them, so a prefill chunk dequantizes each key hundreds of times (on
an H100 the Triton kernel spent 148 of 220 ms of a 32K prefill so). Copying the pages the call's
block table lists into the compute dtype first costs one pass over them (memory-bound, a few
milliseconds for 16 requests of 128K), and then any bf16 sparse kernel serves the call with the
same values (the copy is exact). Decode-shaped calls (a row per request) gather each key once,
and keep reading the cache as it is.

The copy is of the whole table, :data:`DEQUANTIZED_BYTES` at a time (the gathered bytes, the widened
codes and the copy): a call whose table is larger runs in groups of requests, which reads the rows'
requests back to the host once (prefill is not captured in a graph, and its steps are long).
"""

from __future__ import annotations

import torch

from ..model.fp8_cache import pages_in
from ..model.kv_format import ScaledFP8
from .config import decode_shaped

DEQUANTIZED_BYTES = 1 << 30  # pages copied at once, like the other prefill transients the reserve covers

__all__ = ["DEQUANTIZED_BYTES", "attend_dequantized", "prefill_on_dequantized"]


def attend_dequantized(sparse, q, kv_cache, block_table, row_req, slots, scale, v_dim, *,
                       budget: int = DEQUANTIZED_BYTES):
    """``sparse``'s (out, lse) for the call, run on copies of the table's pages in ``q``'s dtype."""
    layout = ScaledFP8.of_width(kv_cache.shape[2], v_dim, q.shape[2] - v_dim)
    # a request's pages as gathered, their codes widened and the copy
    tokens = block_table.shape[1] * kv_cache.shape[1]
    request_bytes = tokens * (kv_cache.shape[2] + (layout.latent_dim + q.shape[2]) * q.element_size())
    if block_table.shape[0] * request_bytes <= budget:
        pages, table = pages_in(kv_cache, block_table, layout, q.dtype)
        return sparse(q, pages, table, row_req, slots, scale, v_dim)
    group = max(1, budget // max(request_bytes, 1))
    out = q.new_zeros(q.shape[0], q.shape[1], v_dim)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    requests = row_req.long().cpu()
    for first in range(0, block_table.shape[0], group):
        rows = torch.nonzero((requests >= first) & (requests < first + group)).squeeze(1).to(q.device)
        if rows.numel() == 0:
            continue
        pages, table = pages_in(kv_cache, block_table[first: first + group], layout, q.dtype)
        out[rows], lse[rows] = sparse(q[rows], pages, table, row_req[rows] - first, slots[rows], scale, v_dim)
    return out, lse


def prefill_on_dequantized(sparse, *, budget: int = DEQUANTIZED_BYTES):
    """``sparse`` (an ``MLAKernels.sparse``) with prefill-shaped calls on a scaled-fp8 (uint8)
    cache served on a copy of their pages in the compute dtype (:func:`attend_dequantized`)."""
    def run(q, kv_cache, block_table, row_req, slots, scale, v_dim):
        if kv_cache.dtype == torch.uint8 and q.shape[0] and not decode_shaped(q.shape[0], block_table.shape[0]):
            return attend_dequantized(sparse, q, kv_cache, block_table, row_req, slots, scale, v_dim, budget=budget)
        return sparse(q, kv_cache, block_table, row_req, slots, scale, v_dim)

    return run
