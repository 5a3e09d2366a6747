"""Torch reference of expanded (MHA-form) MLA attention over packed keys: the spec of
:func:`splash_core.kernels.expanded.expanded_attention` (the contract is in that module's
docstring).

Plain, per-request loops in float32: slow, obviously right, and device-neutral.
"""

from __future__ import annotations

import torch


def expanded_attention(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale):
    """``(out [N, H, d_v] in q's dtype, lse [N, H] float32)``: row i attends, per head, to the
    keys of request ``q_req[i]`` (rows ``k_start[r] .. k_start[r+1]-1``) whose ``k_pos`` is at
    most ``q_pos[i]``, with score ``scale * (q_nope . k_nope + q_rope . k_rope)``."""
    n, heads, _ = q.shape
    d_n = k_nope.shape[2]
    out = torch.zeros(n, heads, v.shape[2], dtype=torch.float32, device=q.device)
    lse = torch.full((n, heads), float("-inf"), dtype=torch.float32, device=q.device)
    q_req, k_start = q_req.long(), k_start.long()
    for r in torch.unique(q_req).tolist():
        rows = (q_req == r).nonzero(as_tuple=True)[0]
        first, end = int(k_start[r]), int(k_start[r + 1])
        if end == first:
            continue
        q_r = q[rows].float()
        scores = (torch.einsum("nhd,mhd->nhm", q_r[..., :d_n], k_nope[first:end].float())
                  + torch.einsum("nhd,md->nhm", q_r[..., d_n:], k_rope[first:end].float())) * scale
        visible = k_pos[first:end].long()[None, :] <= q_pos[rows].long()[:, None]  # [n, m]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=2)  # -inf where nothing is visible
        seen = torch.isfinite(row_lse)
        probs = torch.where(seen[..., None], torch.exp(scores - row_lse[..., None]), 0.0)
        out[rows] = torch.einsum("nhm,mhd->nhd", probs, v[first:end].float())
        lse[rows] = row_lse
    return out.to(q.dtype), lse
