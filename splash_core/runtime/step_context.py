"""One rank's device-side view of a :class:`~splash_core.runtime.step_batch.StepBatch`.

Built once per step and shared by every layer: index tensors are made on first use and cached,
so layers in the same layout reuse them (no per-layer host work beyond block tables, which
:class:`~splash_core.runtime.kv_pool.LayerKV` caches itself).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import torch

from ..interfaces import Collectives, MLAKernels
from ..layouts import Layout, Ownership
from .kv_pool import LayerKV
from .step_batch import StepBatch


@dataclasses.dataclass(frozen=True)
class AttentionView:
    """What a kernel call needs besides queries and the cache (see ``MLAKernels``)."""

    block_table: torch.Tensor  # [R, P] int32
    page_index: torch.Tensor  # [R, P] int32
    row_req: torch.Tensor  # [n] int32
    row_pos: torch.Tensor  # [n] int32


class StepContext:
    """Batch, rank, collectives and kernels of one step on one rank."""

    def __init__(self, batch: StepBatch, rank: int, device: Any, collectives: Collectives, kernels: MLAKernels):
        if batch.T != collectives.size:
            raise ValueError(f"the batch was built for T = {batch.T}, the group has {collectives.size} ranks")
        self.batch = batch
        self.rank = rank
        self.T = batch.T
        self.device = device
        self.collectives = collectives
        self.kernels = kernels
        self.own_rows = batch.owned_row_slice(rank)
        self.num_own_rows = self.own_rows.stop - self.own_rows.start
        self._all_ids = tuple(int(i) for i in batch.ids)
        self._views: dict = {}
        self._holders: dict = {}

    def _tensor(self, array: np.ndarray, dtype=torch.int64) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(array), dtype=dtype, device=self.device)

    @functools.cached_property
    def positions(self) -> torch.Tensor:
        """[N] int64 positions of all rows (RoPE)."""
        return self._tensor(self.batch.row_positions)

    @functools.cached_property
    def last_rows(self) -> torch.Tensor:
        return self._tensor(self.batch.last_rows)

    @functools.cached_property
    def gather_index(self) -> torch.Tensor:
        """Rows of a padded all-gather [T * max_rows] that are real, in batch row order."""
        counts, width = self.batch.owner_rows, int(self.batch.owner_rows.max())
        return self._tensor(np.concatenate([r * width + np.arange(c) for r, c in enumerate(counts)]))

    # ---- attention views ------------------------------------------------------------------

    def _view_rows(self, ownership: Ownership) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
        """(request ids, row_req, row_pos) of the rows this rank attends for in ``ownership``."""
        b = self.batch
        if ownership is Ownership.OWNER:
            owned = b.owned_requests(self.rank)
            rows = np.arange(self.own_rows.start, self.own_rows.stop)
            first = owned[0] if owned.size else 0
            return tuple(int(i) for i in b.ids[owned]), b.row_request[rows] - first, b.row_positions[rows]
        return tuple(int(i) for i in b.ids), b.row_request, b.row_positions

    def _rows_tensors(self, ownership: Ownership):
        if ownership not in self._views:
            ids, row_req, row_pos = self._view_rows(ownership)
            self._views[ownership] = (ids, self._tensor(row_req, torch.int32), self._tensor(row_pos, torch.int32))
        return self._views[ownership]

    def attention_view(self, kv: LayerKV, layout: Layout) -> AttentionView:
        ids, row_req, row_pos = self._rows_tensors(layout.ownership)
        table, index = kv.block_table(ids)
        return AttentionView(table, index, row_req, row_pos)

    # ---- cache writes ---------------------------------------------------------------------

    def holder_rows(self, layout: Layout) -> tuple[np.ndarray, torch.Tensor]:
        """Rows whose new token this rank stores in ``layout`` (host array, device index)."""
        if layout not in self._holders:
            rows = self.batch.page_holder_rows(layout, self.rank)
            self._holders[layout] = (rows, self._tensor(rows))
        return self._holders[layout]

    def write_slots(self, kv: LayerKV, rows: np.ndarray) -> torch.Tensor:
        b = self.batch
        return self._tensor(kv.slots(self._all_ids, b.row_request[rows], b.row_positions[rows]))

    def attend(self, q: torch.Tensor, kv: LayerKV, view: AttentionView, scale: float, v_dim: int):
        """(out [n, H, d_c], lse [n, H]) through the backend's kernels. No rows, or no page held
        here for any of them (a CP shard that is still empty), skip the call: out = 0, lse = -inf."""
        if q.shape[0] == 0 or view.block_table.shape[1] == 0:
            return (q.new_zeros(q.shape[0], q.shape[1], v_dim),
                    torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device))
        fn = self.kernels.decode if self.batch.is_decode else self.kernels.extend
        return fn(q, kv.kv, view.block_table, view.page_index, view.row_req, view.row_pos, scale, v_dim)
