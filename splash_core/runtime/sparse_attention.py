"""DeepSeek Sparse Attention through the backend's kernels, on the rank that holds each row's keys.

Per step and layer: the lightning indexer scores every key slot a row's request holds here
(``MLAKernels.index_scores``; the pages hold each token's indexer key beside its cache entry),
:func:`~splash_core.model.dsa_slots.top_k_slots` keeps each row's best ``k`` slots (a stable sort,
so ties rank by position as on every layout), and absorbed MLA attends over those slots only
(``MLAKernels.sparse``). A backend without these kernels gets the torch reference
(:mod:`splash_core.reference.dsa`). TP, DP and DOP attend on a rank holding the whole history.

CP holds keys split by position, so its top-k is global: each rank all-gathers every rank's local
top-k candidates, (score, position) pairs, and keeps, of its own candidates, those ranking at or
before the row's global k-th key — the single device's selection exactly, and the partial results
merge by log-sum-exp as dense CP's do. Why candidates, by bytes: per query row each rank receives
8·T·k bytes and needs no second round trip; exchanging every visible key's score instead costs
4 bytes a key, cheaper only below a context of 2·T·k (32K tokens at T = 8, k = 2048), where the
candidates' bytes are small anyway. Positions travel as float32, exact below
:data:`POSITION_LIMIT` (the caller checks its contexts on the host).

Where no request's context exceeds k every visible key is selected: the layer attends densely
(the dense kernels) and nothing is scored or exchanged. Score rows are materialized (with their
ranking keys, :data:`~splash_core.model.dsa_slots.BYTES_PER_SLOT` a row and slot), so long prefill
chunks are scored and ranked :data:`SCORE_BYTES` at a time. NaN scores fail the step when its tokens
reach the host (:attr:`StepContext.nan_scores`), so no layer waits for the device to check them.

Shared-indexer layers (GLM-5) have no indexer: they attend over the keys the previous full layer
selected. The full layer leaves its selection as :class:`KeptKeys`, each row's kept keys by
absolute position, which means the same keys on any rank holding them: a shared layer maps them to
its own slots (:func:`slots_of_positions`) in any layout, also in the middle of a switch where it
computes in another layout than the full layer (CP's global top-k is read off the candidates
every rank has).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ..model.dsa_slots import BYTES_PER_SLOT, key_positions, top_k_slots
from ..platform.interfaces import MLAKernels
from ..reference import dsa as reference_dsa
from . import exchange
from .kv_pool import LayerKV
from .step_context import AttentionView, StepContext

SCORE_BYTES = 1 << 30  # score rows and their ranking keys materialized at once (a block of query rows)
POSITION_LIMIT = 2 ** 24  # CP's exchange carries positions as float32: exact below this

__all__ = ["POSITION_LIMIT", "SCORE_BYTES", "KeptKeys", "attend_selected", "select_slots", "slots_of_positions"]


@dataclasses.dataclass(frozen=True)
class KeptKeys:
    """A full DSA layer's selection for the shared layers after it: ``positions`` [n, k] int64,
    the absolute positions of each row's kept keys (-1: none), of all rows of the step
    (``all_rows``) or of this rank's own rows; None: every visible key (no context exceeds k)."""

    positions: torch.Tensor | None
    all_rows: bool

    def rows(self, step: StepContext, all_rows: bool) -> torch.Tensor | None:
        """The positions of all rows, or of this rank's own rows (gathered from their owners where
        the full layer attended for its own rows only: a switch between the two layers)."""
        if self.positions is None or all_rows == self.all_rows:
            return self.positions
        return exchange.gather_rows(step, self.positions) if all_rows else self.positions[step.own_rows]


def select_slots(kernels: MLAKernels, index_q: torch.Tensor, index_w: torch.Tensor, kv: LayerKV, view: AttentionView,
                 topk: int, across: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 nan_flags: list | None = None) -> tuple:
    """(slots [n, k] int32, -1 pads: the keys held here each row attends to; positions [n, k'] int64,
    -1 pads: every key of the row's selection, on whichever rank) for each row's top-``topk``
    keys under the indexer (queries ``index_q`` [n, H, D], weights ``index_w`` [n, H]).
    ``across`` (CP): all-gathers a [n, 2 topk] float32 tensor into [T, n, 2 topk]; every rank
    must call with it, rows or not, keys or not. ``nan_flags``: where NaN scores are reported
    (:func:`~splash_core.model.dsa_slots.top_k_slots`; None: refused at once)."""
    if kv.indexer is None:
        raise ValueError(f"layer {kv.layer}: sparse attention needs the pool to store indexer keys")
    scorer = kernels.index_scores or reference_dsa.index_scores
    n, scale = index_q.shape[0], index_q.shape[-1] ** -0.5
    width = view.block_table.shape[1] * kv.indexer.shape[1]
    block = max(1, SCORE_BYTES // max(1, BYTES_PER_SLOT * width))
    slots, values = [], []
    for start in range(0, n, block):
        rows = slice(start, min(n, start + block))
        scores = (scorer(index_q[rows], index_w[rows], kv.indexer, view.block_table, view.page_index,
                         view.row_req[rows], view.row_pos[rows], scale) if width else
                  index_q.new_empty(rows.stop - rows.start, 0, dtype=torch.float32))
        s, v = top_k_slots(scores, topk, nan_flags)
        slots.append(s)
        values.append(v)
    slots = torch.cat(slots) if slots else torch.empty(0, 0, dtype=torch.int32, device=index_q.device)
    page_size = kv.indexer.shape[1]
    if across is None:
        kept = key_positions(slots, view.page_index, view.row_req, page_size)
        return slots, torch.nn.functional.pad(kept, (0, topk - kept.shape[1]), value=-1)  # same width on every rank
    values = torch.cat(values) if values else torch.empty(0, 0, dtype=torch.float32, device=index_q.device)
    return _globally_ranked(slots, values, view, page_size, topk, across)


def _globally_ranked(slots, values, view: AttentionView, page_size: int, topk: int, across) -> torch.Tensor:
    """CP: (of this rank's local top-k ``slots`` (scores ``values``), those at or before each row's
    global k-th key in (score descending, position ascending) order, -1 elsewhere; the positions
    of the row's global top-k, -1 padded)."""
    n, k = slots.shape
    positions = key_positions(slots, view.page_index, view.row_req, page_size)
    local = torch.full((n, 2, topk), float("-inf"), dtype=torch.float32, device=slots.device)
    local[:, 1] = float(POSITION_LIMIT)  # padding ranks last among equal (-inf) scores
    local[:, 0, :k] = values
    local[:, 1, :k] = torch.where(slots >= 0, positions.float(), float(POSITION_LIMIT))
    every = across(local.view(n, 2 * topk)).view(-1, n, 2, topk).permute(1, 2, 0, 3).reshape(n, 2, -1)
    cand_scores, cand_positions = every[:, 0], every[:, 1]
    by_position = cand_positions.argsort(dim=-1, stable=True)
    ranked = by_position.gather(1, torch.sort(cand_scores.gather(1, by_position), dim=-1, descending=True,
                                              stable=True).indices)
    kth = ranked[:, topk - 1: topk]
    kth_score, kth_position = cand_scores.gather(1, kth), cand_positions.gather(1, kth)
    keep = (slots >= 0) & ((values > kth_score) | ((values == kth_score) & (positions.float() <= kth_position)))
    top = ranked[:, :topk]
    kept = torch.where(torch.isfinite(cand_scores.gather(1, top)), cand_positions.gather(1, top).long(), -1)
    return torch.where(keep, slots, -1), kept


def attend_selected(kernels: MLAKernels, q: torch.Tensor, kv: LayerKV, view: AttentionView, slots: torch.Tensor,
                    scale: float, v_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [n, h, v_dim], lse [n, h] float32) of absorbed queries ``q`` over each row's ``slots``."""
    if q.shape[0] == 0 or slots.shape[1] == 0 or view.block_table.shape[1] == 0:  # nothing held or selected
        return (q.new_zeros(q.shape[0], q.shape[1], v_dim),
                torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device))
    sparse = kernels.sparse or reference_dsa.sparse_attention
    return sparse(q, kv.kv, view.block_table, view.row_req, slots, scale, v_dim)


def slots_of_positions(positions: torch.Tensor, view: AttentionView, page_size: int, longest: int) -> torch.Tensor:
    """Key slots [n, k] int32 of this rank's table for key ``positions`` [n, k] (-1: none) of each
    row's request; -1 where the position's page is not held here (CP's other ranks' keys): how a
    shared-indexer layer attends over the selection a full layer left, in any layout. Sized by
    ``longest`` (tokens: the step's longest context, or a bound of it; a request's logical pages stay
    below its page count), so nothing is read back to the host and a captured step can run it."""
    table, index = view.block_table.long(), view.page_index.long()
    pages = -(-longest // page_size) if table.shape[1] else 0
    if positions.numel() == 0 or pages == 0:
        return torch.full(positions.shape, -1, dtype=torch.int32, device=positions.device)
    slot_of_page = torch.full((table.shape[0], pages + 1), -1, dtype=torch.long, device=table.device)
    held = (table >= 0) & (index >= 0)
    columns = torch.arange(table.shape[1], device=table.device).expand_as(table)
    slot_of_page.scatter_(1, torch.where(held, index, pages), torch.where(held, columns, -1))
    slot_of_page[:, pages] = -1  # the column unheld entries were sent to
    page = (positions // page_size).clamp(0, pages)
    slot = slot_of_page[view.row_req.long()[:, None], torch.where(positions >= 0, page, pages)]
    return torch.where(slot >= 0, slot * page_size + positions % page_size, -1).to(torch.int32)
