"""FlashMLA's dense decode (the ``sgl-flash-mla`` wheel, an optional dependency) as an MLA
decode kernel of the Hopper backend.

FlashMLA reads a request's keys from its block table in order and attends to the first
``cache_seqlens`` of them. SPLASH's block tables list the pages a request holds on this rank,
ascending by position and -1 padded (every layout, CP's every-T-th page included), and in a
decode step only the request's last page can be partly written, so the keys a row may see are
exactly the first ``sum over its pages of clamp(row_pos + 1 - page * page_size, 0, page_size)``.
Attention is a sum over keys, so the pages' positions need not be consecutive.

FlashMLA serves bf16 caches of 64-token pages with 576-wide keys (512 latent + 64 rotary) and
one query row per request; any other call goes to the fallback (the Triton kernel).
"""

from __future__ import annotations

import importlib.util

import torch

PAGE = 64
KEY_WIDTH, VALUE_WIDTH = 576, 512


def missing_reason() -> str | None:
    """None when the wheel can be imported here, else why not (cheap: no import)."""
    if importlib.util.find_spec("flash_mla") is None:
        return "sgl-flash-mla is not installed (pip install 'splash-backend-hopper[flashmla]')"
    return None


def serves(q, kv_cache, v_dim: int) -> bool:
    """Whether FlashMLA's dense decode can take this call."""
    return (q.dtype == torch.bfloat16 and kv_cache.dtype == torch.bfloat16 and kv_cache.shape[1] == PAGE
            and kv_cache.shape[2] == KEY_WIDTH and q.shape[-1] == KEY_WIDTH and v_dim == VALUE_WIDTH
            and q.shape[1] <= 128)


def visible_keys(block_table, page_index, row_pos, page_size: int) -> torch.Tensor:
    """Per row, how many of its listed keys it sees (``int32``), as FlashMLA's ``cache_seqlens``."""
    seen = (row_pos[:, None].long() + 1 - page_index.long() * page_size).clamp(0, page_size)
    return torch.where(block_table >= 0, seen, 0).sum(dim=1).to(torch.int32)


def decode(fallback):
    """An ``MLAKernels.decode`` that runs FlashMLA where :func:`serves` says it can, else ``fallback``."""
    from flash_mla import flash_mla_with_kvcache, get_mla_metadata

    def run(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim):
        if not serves(q, kv_cache, v_dim):
            return fallback(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim)
        req = row_req.long()
        table, index = block_table[req], page_index[req]
        seqlens = visible_keys(table, index, row_pos, kv_cache.shape[1])
        out, lse = flash_mla_with_kvcache(
            q.unsqueeze(1).contiguous(), kv_cache.unsqueeze(2), table.clamp(min=0).contiguous(), seqlens, v_dim,
            get_mla_metadata()[0], softmax_scale=scale, causal=False, use_legacy=True)
        out, lse = out[:, 0], lse[:, :, 0].float()
        empty = (seqlens == 0)[:, None]  # no visible key: out 0 and lse -inf, as the contract says
        return out.masked_fill(empty[..., None], 0), lse.masked_fill(empty, float("-inf"))

    return run
