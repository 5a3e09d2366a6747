"""Torch reference of the MLA kernels (the spec in :class:`splash_core.platform.interfaces.MLAKernels`).

Plain, per-request loops in float32: slow, obviously right, and device-neutral, so any
backend may fall back to it.
"""

from __future__ import annotations

import torch

from ..model.fp8_cache import cache_layout, dequantize


def _request_keys(kv_cache, block_table_row, page_index_row):
    """Keys of one request held here and their absolute positions."""
    page_size = kv_cache.shape[1]
    valid = block_table_row >= 0
    pages = block_table_row[valid].long()
    keys = kv_cache[pages].reshape(-1, kv_cache.shape[2])
    offsets = torch.arange(page_size, device=kv_cache.device)
    positions = (page_index_row[valid].long()[:, None] * page_size + offsets).reshape(-1)
    return keys, positions


def attention(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim):
    """Absorbed MLA attention over paged latent keys; returns (out [N, H, v_dim], lse [N, H]).
    A uint8 cache holds scaled-fp8 entries, read back as their float32 values."""
    n, heads, width = q.shape
    scaled = cache_layout(kv_cache, v_dim, width - v_dim)
    out = torch.zeros(n, heads, v_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((n, heads), float("-inf"), dtype=torch.float32, device=q.device)
    row_req = row_req.long()
    for r in torch.unique(row_req).tolist():
        rows = (row_req == r).nonzero(as_tuple=True)[0]
        keys, positions = _request_keys(kv_cache, block_table[r], page_index[r])
        if keys.shape[0] == 0:
            continue
        keys = keys.float() if scaled is None else dequantize(keys, scaled)
        scores = torch.einsum("nhw,mw->nhm", q[rows].float(), keys) * scale
        visible = positions[None, :] <= row_pos[rows].long()[:, None]  # [n, m]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [n, H]
        probs = torch.exp(scores - row_lse[..., None]).nan_to_num(0.0)
        out[rows] = probs @ keys[:, :v_dim]
        lse[rows] = row_lse
    return out.to(q.dtype), lse


def merge(outs, lses):
    """Combine partial attention [P, N, H, D] with their lse [P, N, H] by log-sum-exp."""
    lses = lses.float()
    total = torch.logsumexp(lses, dim=0)  # [N, H]
    weights = torch.exp(lses - total[None]).nan_to_num(0.0)  # -inf - -inf -> nan -> 0
    out = (weights[..., None] * outs.float()).sum(0)
    return out.to(outs.dtype), total


def pack(cache, pages, out=None):
    """Copy whole pages into one contiguous buffer [n, page_size, W] (``out``, if given)."""
    if out is None:
        return cache.index_select(0, pages.long())
    return torch.index_select(cache, 0, pages.long(), out=out)


def unpack(cache, pages, buf):
    """Write a packed buffer back into ``pages`` of ``cache`` (in place)."""
    cache.index_copy_(0, pages.long(), buf.to(cache.dtype))
