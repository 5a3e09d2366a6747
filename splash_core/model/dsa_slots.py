"""DeepSeek Sparse Attention's selection over *key slots*: the names the kernel contract uses.

A rank's keys of request ``r`` are named by their slot in its block table row:
``slot * page_size + offset``. Block tables list the pages a rank holds ascending by position
(every layout, CP's every-T-th page included), so slot order is position order, and ranking equal
scores by slot ranks them by position, earlier first — :func:`splash_core.model.dsa.select`'s
order, which makes every layout select the same keys where scores tie at the k-th place.

The ranking is one ``torch.topk`` over an int64 key per slot (the score's float32 bits mapped to an
order-preserving integer in the high half, the slot reversed in the low half): every key differs,
so the selection and its order are those of a stable descending sort, without sorting each row
(a prefill chunk at 128K scores 131,072 slots a row and keeps 2,048).
"""

from __future__ import annotations

import torch

__all__ = ["BYTES_PER_SLOT", "NAN_SCORES", "key_positions", "ranking_keys", "top_k_slots"]

NAN_SCORES = "indexer scores hold NaN: the selection would be arbitrary"
BYTES_PER_SLOT = 16  # what ranking a score row materializes per slot: the score, its ordered bits, the int64 key


def top_k_slots(scores: torch.Tensor, top_k: int,
                nan_flags: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slots [N, min(top_k, S)] int32, their scores)`` of score rows ``scores`` [N, S] float32
    (-inf: not visible): each row's best slots in descending score order, equal scores by slot; -1
    (score -inf) where the row sees fewer than ``top_k`` keys. NaN scores are refused (they would
    rank first and select an arbitrary key): at once, or, where ``nan_flags`` is given, by
    appending a device flag to it that the step checks when its tokens reach the host (no wait here)."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1 (got {top_k})")
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be float32 [rows, slots] (got {scores.dtype} {tuple(scores.shape)})")
    if nan_flags is None:
        if bool(torch.isnan(scores).any()):
            raise ValueError(NAN_SCORES)
    else:
        nan_flags.append(torch.isnan(scores).any())
    k = min(top_k, scores.shape[1])
    slots = torch.topk(ranking_keys(scores), k, dim=1, sorted=True).indices
    values = scores.gather(1, slots)
    return torch.where(torch.isneginf(values), -1, slots).to(torch.int32), values


def ranking_keys(scores: torch.Tensor) -> torch.Tensor:
    """[N, S] int64 keys ordered as (score descending, slot ascending) is: the float32 score's bits
    made order-preserving (a negative float's magnitude bits flipped; -0.0 counted as 0.0, as a sort
    compares them) above the reversed slot."""
    bits = (scores + 0.0).contiguous().view(torch.int32)  # x + 0.0 turns -0.0 into 0.0
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    slots = scores.shape[1]
    reversed_slot = torch.arange(slots - 1, -1, -1, dtype=torch.int64, device=scores.device)
    return (ordered << 32) + reversed_slot


def key_positions(slots: torch.Tensor, page_index: torch.Tensor, row_req: torch.Tensor, page_size: int) -> torch.Tensor:
    """Token positions [N, K] int64 of key ``slots`` [N, K] (-1 stays -1): what CP's merge of
    per-rank selections compares, since each rank's slots count only its own pages."""
    req = row_req.long()[:, None]
    page = page_index.long()[req, slots.clamp(min=0).long() // page_size]
    return torch.where(slots >= 0, page * page_size + slots.long() % page_size, -1)
