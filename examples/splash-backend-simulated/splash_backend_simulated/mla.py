"""The simulated device's MLA decode kernel, in plain torch.

A device's decode kernel splits each request's history into ranges of pages (split-K), scores
each range on its own processors and merges the partial results by their log-sum-exp. This
computes the same thing the same way, for all rows at once: each row gathers its request's
pages through the block table, holes (-1) and keys after the row's position masked out, and
one einsum per range does the absorbed attention (queries against latent ++ rotary keys; the
latent is also the value). So the conformance suite checks the algorithm's semantics (page
lookup, causality, rows that see no key, the LSE it returns) before the device kernel exists.
It favours clarity over memory: every row copies its request's pages. A uint8 cache holds the
scaled-fp8 format; its pages are read back as float32 values by the core's reference
(a device kernel dequantizes each key tile after loading it).
"""

from __future__ import annotations

import torch

from splash_core.model.fp8_cache import cache_layout, dequantize
from splash_core.reference.mla import merge

PAGES_PER_SPLIT = 4  # pages of history one split scores (a device kernel picks this per shape)


def decode(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim):
    """``MLAKernels.decode`` (see :class:`splash_core.platform.interfaces.MLAKernels`): (out [N, H, v_dim]
    in q's dtype, lse [N, H] float32; out = 0 and lse = -inf where a row sees no key)."""
    page_size = kv_cache.shape[1]
    table = block_table[row_req.long()].long()  # [N, P] the physical pages of each row's request
    held = table >= 0
    keys = kv_cache[table.clamp(min=0)]  # [N, P, page, W]; a hole reads page 0, masked below
    scaled = cache_layout(kv_cache, v_dim, q.shape[-1] - v_dim)
    keys = keys.float() if scaled is None else dequantize(keys, scaled)
    offsets = torch.arange(page_size, device=kv_cache.device)
    positions = page_index[row_req.long()].long()[..., None] * page_size + offsets  # [N, P, page]
    visible = held[..., None] & (positions <= row_pos.long()[:, None, None])
    queries = q.float()
    outs, lses = [], []
    for first in range(0, table.shape[1], PAGES_PER_SPLIT):
        split = slice(first, first + PAGES_PER_SPLIT)
        k = keys[:, split].flatten(1, 2)  # [N, M, W]
        scores = torch.einsum("nhw,nmw->nhm", queries, k) * scale
        scores = scores.masked_fill(~visible[:, split].flatten(1)[:, None, :], float("-inf"))
        lses.append(torch.logsumexp(scores, dim=-1))  # -inf where this split sees no key
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # such rows: all weights 0
        outs.append(torch.einsum("nhm,nmv->nhv", weights, k[..., :v_dim]))
    out, lse = merge(torch.stack(outs), torch.stack(lses))
    return out.to(q.dtype), lse
