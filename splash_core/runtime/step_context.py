"""One rank's device-side view of a :class:`~splash_core.runtime.step_batch.StepBatch`.

Built once per step and shared by every layer: whatever all layers of one layout have in
common is made on first use and kept for the step (index tensors, the RoPE of the step's
positions, attention rows, split sizes), so a layer adds no host-to-device copy of its own in
the common case:

- block tables come from :class:`~splash_core.runtime.kv_pool.LayerKV`, which keeps them until
  its pages change;
- cache-write slots depend on a layer's physical pages, so they are computed per layer on the
  host, but layers whose slots are equal (the same allocation order, the usual case) share one
  device tensor.

Host arrays reach the device through :func:`~splash_core.platform.device.to_device` (staged in
pinned memory, copied asynchronously), so no copy waits for the kernels already queued.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import torch

from ..layouts import Layout, Ownership
from ..model.rotary import Rotary
from ..planning.attention_forms import MLADims, expanded_requests
from ..platform.device import to_device
from ..platform.interfaces import Collectives, MLAKernels
from ..profiles.model import RopeScaling
from .expanded_attention import ExpandedKeys, FormRows, visible_keys
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

    host_reads = True  # whether the step may read device values back to the host (a captured one may not)

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
        self._views: dict = {}
        self._holders: dict = {}
        self._slots: dict = {}  # slot bytes -> device slots, shared by the layers whose slots are equal
        self._rotary: dict = {}
        self._forms: dict = {}
        self._key_uploads: dict = {}  # expanded keys' slots and positions, shared by layers whose pages are equal
        # the last DSA layer's top-k, reused by the shared-indexer layers after it (GLM-5); opaque:
        # each sparse attention path leaves and reads its own kind of selection
        self.selection: Any = None
        # device flags, one per scored block, true where indexer scores held NaN: checked once the
        # step's tokens reach the host (Model.step_tokens) or at the end of Model.step, not per layer
        self.nan_scores: list[torch.Tensor] = []

    def attends_sparsely(self, topk: int) -> bool:
        """Whether DSA layers select top-``topk`` keys this step: where some context exceeds it
        (else every visible key is selected: they attend densely)."""
        return self.longest_context() > topk

    def longest_context(self) -> int:
        """The step's longest context in tokens (an upper bound where the step is captured)."""
        return int(self.batch.contexts.max())

    def _tensor(self, array: np.ndarray, dtype=torch.int64) -> torch.Tensor:
        return to_device(array, self.device, dtype)

    @functools.cached_property
    def positions(self) -> torch.Tensor:
        """[N] int64 positions of all rows (RoPE)."""
        return self._tensor(self.batch.row_positions)

    def rotary(self, dim: int, theta: float, own: bool = False, scaling: RopeScaling | None = None,
               rotates: bool = True) -> Rotary:
        """RoPE of all rows' positions (``own``: this rank's rows), computed once per step
        (``rotates`` False: no rotation, for MLA without position encoding)."""
        key = (dim, theta, scaling, rotates)
        if key not in self._rotary:
            every = (Rotary.at(self.positions, dim, theta, scaling) if rotates
                     else Rotary.identity(len(self.positions), dim, self.positions.device))
            self._rotary[key] = (every, every.rows(self.own_rows))
        return self._rotary[key][own]

    @functools.cached_property
    def last_rows(self) -> torch.Tensor:
        return self._tensor(self.batch.last_rows)

    @functools.cached_property
    def owner_splits(self) -> list[int]:
        """Rows each rank owns, as the split sizes of the layouts' exchanges."""
        return [int(c) for c in self.batch.owner_rows]

    @functools.cached_property
    def gather_index(self) -> torch.Tensor | None:
        """Rows of a padded all-gather [T * max_rows] that are real, in batch row order; None when
        every rank owns as many rows (then the gather is already in batch order)."""
        counts, width = self.batch.owner_rows, int(self.batch.owner_rows.max())
        if (counts == width).all():
            return None
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

    def form_rows(self, layout: Layout, form: str, dims: MLADims) -> FormRows | None:
        """The rows this rank attends for in ``layout``, split into those whose request attends
        expanded (:func:`~splash_core.planning.attention_forms.expanded_requests`, decided from the whole batch,
        so every rank and layer decides alike) and the rest; None when none does (always for
        decode steps, and without a backend ``expanded`` kernel)."""
        if self.batch.is_decode or self.kernels.expanded is None or form == "absorbed":
            return None
        key = (layout.ownership, form, dims)
        if key not in self._forms:
            b = self.batch
            chosen = expanded_requests(form, dims, b.rows, b.contexts)
            if layout.ownership is Ownership.OWNER:
                chosen = chosen[b.owned_requests(self.rank)]
            _, row_req, row_pos = self._view_rows(layout.ownership)
            self._forms[key] = FormRows.split(row_req, row_pos, np.flatnonzero(chosen), self.device)
        return self._forms[key]

    def expanded_keys(self, kv: LayerKV, layout: Layout, rows: FormRows) -> ExpandedKeys:
        """The keys ``rows``' expanded requests see in this layer, request after request."""
        ids = self._rows_tensors(layout.ownership)[0]
        return visible_keys(kv.host_block_table(ids), rows, kv.format.page_size, self.device, self._key_uploads)

    # ---- cache writes ---------------------------------------------------------------------

    def holder_rows(self, layout: Layout) -> np.ndarray:
        """Rows whose new token this rank stores in ``layout``."""
        return self._holder(layout)[0]

    def _holder(self, layout: Layout):
        """(holder rows, their request slots among the attention view's requests, positions): the
        write addresses pages through the same block tables as attention (one build per layer)."""
        if layout not in self._holders:
            b = self.batch
            rows = b.page_holder_rows(layout, self.rank)
            slot = b.row_request[rows]
            if layout.ownership is Ownership.OWNER and rows.size:
                slot = slot - b.owned_requests(self.rank)[0]
            self._holders[layout] = (rows, slot, b.row_positions[rows])
        return self._holders[layout]

    def holder_index(self, layout: Layout) -> torch.Tensor:
        """:meth:`holder_rows` as a device index (to select them from all rows)."""
        key = ("index", layout)
        if key not in self._holders:
            self._holders[key] = self._tensor(self.holder_rows(layout))
        return self._holders[key]

    def write_slots(self, kv: LayerKV, layout: Layout) -> torch.Tensor:
        """Flat cache slots [n] of :meth:`holder_rows` in ``kv``: computed on the host per layer (pages
        differ per layer), copied to the device once per distinct content in the step."""
        _, slot, positions = self._holder(layout)
        slots = kv.slots(self._rows_tensors(layout.ownership)[0], slot, positions)
        key = slots.tobytes()
        if key not in self._slots:
            self._slots[key] = self._tensor(slots)
        return self._slots[key]

    def attend(self, q: torch.Tensor, kv: LayerKV, view: AttentionView, scale: float, v_dim: int):
        """(out [n, H, d_c], lse [n, H]) through the backend's kernels. No rows, or no page held
        here for any of them (a CP shard that is still empty), skip the call: out = 0, lse = -inf."""
        if q.shape[0] == 0 or view.block_table.shape[1] == 0:
            return (q.new_zeros(q.shape[0], q.shape[1], v_dim),
                    torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device))
        fn = self.kernels.decode if self.batch.is_decode else self.kernels.extend
        return fn(q, kv.kv, view.block_table, view.page_index, view.row_req, view.row_pos, scale, v_dim)
