"""DeepSeek Sparse Attention over the paged cache, on the rank that holds each request's history.

For the rows a rank attends for, each request's cache entries and indexer keys are read from
the pages the rank holds (the same pages, :class:`~splash_core.runtime.kv_pool.LayerKV` keeps the
indexer keys beside the entries), the indexer scores every visible key, and absorbed MLA runs over
each row's top-k keys only (:mod:`splash_core.model.dsa`). Plain torch, one request at a time:
the correctness path, in every layout. TP, DP and DOP attend on a rank holding the whole history;
CP's keys are split by position, so the top-k is made global by one all-gather of each rank's
local top-k candidates (see :func:`attend_sparse`). Scaled-fp8 pages are read back as their float32 values.

Why candidates, by bytes: per query row, each rank receives T·k (score, position) pairs, 8 T k
bytes, and no second round trip is needed (each rank derives the row's k-th key itself and keeps
its own keys that rank before it). Exchanging every visible key's score instead costs 4 bytes per
key, 4·context, cheaper only below a context of 2 T k (32K tokens at T = 8, k = 2048), where
the candidates' bytes are small anyway; and where no request's context exceeds k every visible key
is selected, so nothing is exchanged at all (:meth:`~splash_core.runtime.mla_layer.MLALayer._attend`).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..model.dsa import index_scores, ranked_before, select, sparse_attention, visible
from ..model.fp8_cache import dequantize
from .kv_pool import LayerKV
from .step_context import AttentionView

POSITION_LIMIT = 2 ** 24  # positions travel as float32 in CP's exchange of top-k candidates: exact below this


def _held(pages: torch.Tensor, table_row: torch.Tensor, index_row: torch.Tensor, scaled) -> tuple:
    """(rows [m, W] float32 of one request's pages held here, their absolute positions [m])."""
    page_size = pages.shape[1]
    valid = table_row >= 0
    rows = pages[table_row[valid].long()].reshape(-1, pages.shape[2])
    offsets = torch.arange(page_size, device=pages.device)
    positions = (index_row[valid].long()[:, None] * page_size + offsets).reshape(-1)
    return (rows.float() if scaled is None else dequantize(rows, scaled)), positions


def attend_sparse(q: torch.Tensor, index_q: torch.Tensor, index_w: torch.Tensor, kv: LayerKV, view: AttentionView,
                  topk: int, scale: float, d_c: int,
                  across: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [n, h, d_c], lse [n, h] float32) of absorbed queries ``q`` [n, h, d_c + d_r] over the
    top-``topk`` keys the indexer (queries ``index_q`` [n, H, D], weights ``index_w`` [n, H])
    selects among each row's visible keys; ``view`` says which request and position each row is.

    ``across`` (CP, keys split by position over the ranks): all-gathers every rank's [n, 2 topk]
    local top-k candidates (scores, then positions) into [T, n, 2 topk], so each rank keeps, of
    the keys it holds, those ranking at or before the row's global k-th key (in
    :func:`~splash_core.model.dsa.select`'s order, ties by position): the single device's
    selection exactly, and its partial results merge by log-sum-exp as dense CP's do."""
    if kv.indexer is None:
        raise ValueError(f"layer {kv.layer}: sparse attention needs the pool to store indexer keys")
    n, heads, _ = q.shape
    row_req, row_pos = view.row_req.long(), view.row_pos.long()
    held = []
    for r in torch.unique(row_req).tolist():
        rows = (row_req == r).nonzero(as_tuple=True)[0]
        entries, positions = _held(kv.kv, view.block_table[r], view.page_index[r], kv.format.scaled)
        keys, _ = _held(kv.indexer, view.block_table[r], view.page_index[r], kv.format.indexer_scaled)
        seen = visible(row_pos[rows], positions)
        held.append((rows, entries, positions, index_scores(index_q[rows], index_w[rows], keys, seen)))
    kth = None if across is None else _global_kth(held, n, topk, across, q.device)
    out = torch.zeros(n, heads, d_c, dtype=torch.float32, device=q.device)
    lse = torch.full((n, heads), float("-inf"), dtype=torch.float32, device=q.device)
    for rows, entries, positions, scores in held:
        if entries.shape[0] == 0:
            continue
        if kth is None:
            indices, valid = select(scores, topk, positions)
        else:
            indices = torch.arange(scores.shape[1], device=q.device).expand(rows.numel(), -1)
            valid = torch.isfinite(scores) & ranked_before(scores, positions, kth[0][rows], kth[1][rows])
        out[rows], lse[rows] = sparse_attention(q[rows], entries, indices, valid, d_c, scale)
    return out.to(q.dtype), lse


def _global_kth(held, n: int, topk: int, across, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(score [n], position [n]) of each row's k-th key over all ranks in :func:`select`'s order
    (score -inf where fewer than k are visible): every rank sends its local top-k (score, position)
    pairs, positions as float32 (exact below :data:`POSITION_LIMIT`)."""
    local = torch.full((n, 2, topk), float("-inf"), dtype=torch.float32, device=device)
    local[:, 1] = float(POSITION_LIMIT)  # padding ranks last among equal (-inf) scores
    for rows, _, positions, scores in held:
        if scores.shape[1]:
            if int(positions.max()) >= POSITION_LIMIT:
                raise ValueError(f"CP's sparse attention exchanges positions below {POSITION_LIMIT} "
                                 f"(got {int(positions.max())})")
            indices, _ = select(scores, topk, positions)
            k = indices.shape[1]
            local[rows, 0, :k] = scores.gather(1, indices)
            local[rows, 1, :k] = positions[indices].float()
    every = across(local.view(n, 2 * topk)).view(-1, n, 2, topk).permute(1, 2, 0, 3).reshape(n, 2, -1)
    cand_scores, cand_positions = every[:, 0], every[:, 1]
    order = cand_positions.argsort(dim=-1, stable=True)
    by_position = cand_scores.gather(1, order)
    ranked = order.gather(1, torch.sort(by_position, dim=-1, descending=True, stable=True).indices)
    last = ranked[:, topk - 1: topk]
    return cand_scores.gather(1, last)[:, 0], cand_positions.gather(1, last)[:, 0].long()
