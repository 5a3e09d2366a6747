"""Torch reference of the DeepSeek Sparse Attention kernels (the spec in
:class:`splash_core.platform.interfaces.MLAKernels`: ``index_scores`` and ``sparse``).

Whole-batch gathers in float32 over every key slot of each row's request: obviously right and
device-neutral (memory grows with rows x slots, so it suits the CPU sizes it serves).
Scaled-fp8 pages are read back as their float32 values.
"""

from __future__ import annotations

import torch

from ..model.fp8_cache import dequantize
from ..model.kv_format import ScaledFP8


def _values(cache: torch.Tensor, latent_dim: int, rope_dim: int) -> torch.Tensor:
    """``cache`` [pages, page_size, W] as float32 values (a uint8 cache dequantized)."""
    if cache.dtype != torch.uint8:
        return cache.float()
    layout = ScaledFP8.of_width(cache.shape[2], latent_dim, rope_dim)
    return dequantize(cache.reshape(-1, cache.shape[2]), layout).view(*cache.shape[:2], -1).float()


def _slot_pages(block_table, page_index, row_req, page_size: int):
    """Per query row and key slot of its request: (physical page, offset, position); page -1 on a hole."""
    slot = torch.arange(block_table.shape[1] * page_size, device=block_table.device)
    req = row_req.long()
    page = block_table.long()[req][:, slot // page_size]
    position = page_index.long()[req][:, slot // page_size] * page_size + slot % page_size
    return page, slot % page_size, position


def index_scores(q, weights, index_keys, block_table, page_index, row_req, row_pos, scale):
    """Scores [N, P * page_size] float32: ``sum_h weights[n, h] ReLU(scale q[n, h] . k[slot])``,
    -inf where the slot is a hole or after the row's position."""
    page, offset, position = _slot_pages(block_table, page_index, row_req, index_keys.shape[1])
    keys = _values(index_keys, q.shape[2], 0)[page.clamp(min=0), offset]  # [N, S, D]
    per_head = torch.relu(torch.einsum("nhd,nsd->nhs", q.float(), keys) * scale)
    scores = (weights.float()[:, :, None] * per_head).sum(1)
    visible = (page >= 0) & (position <= row_pos.long()[:, None])
    return scores.masked_fill(~visible, float("-inf"))


def sparse_attention(q, kv_cache, block_table, row_req, slots, scale, v_dim):
    """(out [N, H, v_dim] in q's dtype, lse [N, H] float32): row n attends to the key slots
    ``slots[n]`` (-1 pads; a slot past the table or on a hole is skipped); no key: 0 and -inf."""
    keys_all = _values(kv_cache, v_dim, q.shape[2] - v_dim)
    page_size = kv_cache.shape[1]
    table_slot = slots.long() // page_size
    listed = (slots >= 0) & (table_slot < block_table.shape[1])
    page = block_table.long()[row_req.long()[:, None], torch.where(listed, table_slot, 0)]
    held = listed & (page >= 0)
    keys = keys_all[page.clamp(min=0), slots.clamp(min=0).long() % page_size]  # [N, K, W]
    logits = torch.einsum("nhw,nkw->nhk", q.float(), keys) * scale
    logits = logits.masked_fill(~held[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, -1)
    probs = torch.exp(logits - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return torch.einsum("nhk,nkv->nhv", probs, keys[..., :v_dim]).to(q.dtype), lse
