"""DeepSeek Sparse Attention's selection over *key slots*: the names the kernel contract uses.

A rank's keys of request ``r`` are named by their slot in its block table row:
``slot * page_size + offset``. Block tables list the pages a rank holds ascending by position
(every layout, CP's every-T-th page included), so slot order is position order, and a stable
sort over slots ranks equal scores by position, earlier first — :func:`splash_core.model.dsa.select`'s
order, which makes every layout select the same keys where scores tie at the k-th place.
"""

from __future__ import annotations

import torch

__all__ = ["key_positions", "top_k_slots"]


def top_k_slots(scores: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slots [N, min(top_k, S)] int32, their scores)`` of score rows ``scores`` [N, S] (-inf:
    not visible): each row's best slots in descending score order, equal scores by slot; -1 (score
    -inf) where the row sees fewer than ``top_k`` keys. NaN scores are refused (they would rank
    first and select an arbitrary key)."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1 (got {top_k})")
    if scores.dim() != 2:
        raise ValueError(f"scores must be [rows, slots] (got {tuple(scores.shape)})")
    if bool(torch.isnan(scores).any()):
        raise ValueError("indexer scores hold NaN: the selection would be arbitrary")
    top = torch.sort(scores, dim=1, descending=True, stable=True)
    k = min(top_k, scores.shape[1])
    values, slots = top.values[:, :k], top.indices[:, :k]
    return torch.where(torch.isneginf(values), -1, slots).to(torch.int32), values


def key_positions(slots: torch.Tensor, page_index: torch.Tensor, row_req: torch.Tensor, page_size: int) -> torch.Tensor:
    """Token positions [N, K] int64 of key ``slots`` [N, K] (-1 stays -1): what CP's merge of
    per-rank selections compares, since each rank's slots count only its own pages."""
    req = row_req.long()[:, None]
    page = page_index.long()[req, slots.clamp(min=0).long() // page_size]
    return torch.where(slots >= 0, page * page_size + slots.long() % page_size, -1)
