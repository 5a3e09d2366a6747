"""A decode step read from persistent buffers: the shapes and addresses a captured graph replays.

A decode step of a bucket of ``b`` rows per owner rank is laid out as ``T * b`` rows, owner
major: rank r's requests take rows ``[r b, r b + n_r)`` and the rest of its ``b`` are padding.
Every owner then has ``b`` rows, so every exchange of every layout has equal, fixed splits (the
padding rule: owners see equal row counts in every captured all-to-all and all-gather), and the
batch the layers see is a fixed *skeleton* :class:`~splash_core.runtime.step_batch.StepBatch`
of one-row requests. Padding rows read table row 0 (no pages: attention sees no key, out 0,
lse -inf) and write their cache entries to the layer's sink page.

What changes from step to step lives in :class:`DecodeInputs` (token ids, positions, table rows,
where each request's row sits), refreshed in place by one host-to-device copy, and in
:class:`~splash_core.runtime.device_tables.DeviceTables`; :class:`StaticStepContext` derives
everything else on the device (RoPE, write slots, the kernels' int32 views), so the work of a
step can be recorded once and replayed.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..layouts import Layout, Ownership
from .device_tables import DeviceTables
from .kv_pool import LayerKV
from .step_batch import StepBatch
from .step_context import AttentionView, StepContext

TOKENS, POSITIONS, ROWS, PLACES = range(4)


@functools.lru_cache(maxsize=64)
def skeleton(T: int, per_owner: int, page_size: int) -> StepBatch:
    """The fixed batch a bucket's layers see: ``per_owner`` one-row requests on every rank."""
    return StepBatch.build([(i, i // per_owner, 0, 1) for i in range(T * per_owner)], T, page_size)


class DecodeInputs:
    """The persistent inputs of one bucket: ``data`` [4, T b] int64 on the device, rows token id,
    position and table row of each padded row, and (first R entries) the padded row of each
    request of the step in batch order."""

    def __init__(self, T: int, per_owner: int, device):
        self.T, self.per_owner = T, per_owner
        self.data = torch.zeros(4, T * per_owner, dtype=torch.int64, device=device)

    @property
    def tokens(self) -> torch.Tensor:
        return self.data[TOKENS]

    @property
    def positions(self) -> torch.Tensor:
        return self.data[POSITIONS]

    @property
    def rows(self) -> torch.Tensor:
        return self.data[ROWS]

    def places(self, requests: int) -> torch.Tensor:
        """The padded row of each of the step's ``requests`` requests (device, batch order)."""
        return self.data[PLACES, :requests]

    def fill(self, batch: StepBatch, table_rows: np.ndarray, tokens: torch.Tensor) -> None:
        """Refresh in place for decode ``batch`` (rows in batch order, ``table_rows`` per request,
        ``tokens`` [R] on any device): one copy from the host, and where the tokens are already on
        the device, one scatter of them into place (their values never visit the host)."""
        host = np.zeros((4, self.data.shape[1]), dtype=np.int64)
        place = batch.owners * self.per_owner + (np.arange(len(batch)) - batch.owner_row_offsets[batch.owners])
        host[POSITIONS, place] = batch.starts
        host[ROWS, place] = table_rows
        host[PLACES, : len(batch)] = place
        on_host = tokens.device.type == "cpu"
        if on_host:
            host[TOKENS, place] = tokens.numpy()
        staged = torch.from_numpy(host)
        if self.data.device.type == "cpu":
            self.data.copy_(staged)
        else:  # the pinned staging buffer lives until the copy ran (torch's pinned allocator)
            self.data.copy_(staged.pin_memory(), non_blocking=True)
        if not on_host:
            self.data[TOKENS].index_copy_(0, self.places(len(batch)), tokens.to(self.data.device).long())


class StaticStepContext(StepContext):
    """:class:`StepContext` of a padded decode step over :class:`DecodeInputs` and
    :class:`DeviceTables`: made of device operations on fixed buffers only (no host array
    reaches the device while it runs)."""

    last_rows = None  # one row per request: every row's logits are wanted
    host_reads = False  # replayed from a captured graph

    def __init__(self, batch: StepBatch, rank: int, device, collectives, kernels, inputs: DecodeInputs,
                 tables: DeviceTables, sparse: bool = False):
        """``sparse``: DSA layers select their top-k (the graph of steps where some context exceeds k)."""
        super().__init__(batch, rank, device, collectives, kernels)
        self.inputs, self.tables, self.sparse = inputs, tables, sparse
        self._int32 = {}
        self._write: dict[Ownership, torch.Tensor] = {}

    @property
    def positions(self) -> torch.Tensor:
        return self.inputs.positions

    def attends_sparsely(self, topk: int) -> bool:
        return self.sparse

    def longest_context(self) -> int:
        """The most tokens a table row holds (every T-th page where CP splits them)."""
        return self.tables.width * self.batch.page_size * self.T

    def _narrow(self, which: int) -> torch.Tensor:
        """Row ``which`` of the inputs as the int32 the kernels take (converted once a step)."""
        if which not in self._int32:
            self._int32[which] = self.inputs.data[which].to(torch.int32)
        return self._int32[which]

    def _rows(self, ownership: Ownership) -> slice:
        return self.own_rows if ownership is Ownership.OWNER else slice(None)

    def _rows_tensors(self, ownership: Ownership):
        if ownership not in self._views:  # one view for every layer: the kernels' per-tensor caches hit
            rows = self._rows(ownership)
            self._views[ownership] = (None, self._narrow(ROWS)[rows], self._narrow(POSITIONS)[rows])
        return self._views[ownership]

    def attention_view(self, kv: LayerKV, layout: Layout) -> AttentionView:
        _, row_req, row_pos = self._rows_tensors(layout.ownership)
        k = self.tables.position[kv.layer]
        return AttentionView(self.tables.pages[k], self.tables.index[k], row_req, row_pos)

    def holder_rows(self, layout: Layout) -> np.ndarray:
        """Every row this rank computes the cache entries of writes them (to the sink where it
        holds not the row's page), so they are the owner's rows, or all."""
        return np.arange(self.batch.num_rows)[self._rows(layout.ownership)]

    def write_slots(self, kv: LayerKV, layout: Layout) -> torch.Tensor:
        """Flat slots of :meth:`holder_rows` in ``kv``, from the device tables (all layers of one
        ownership at once, on first use in the step)."""
        ownership = layout.ownership
        if ownership not in self._write:
            rows = self._rows(ownership)
            every = self.T if ownership is Ownership.POSITIONS else 1
            self._write[ownership] = self.tables.write_slots(self.inputs.rows[rows], self.inputs.positions[rows],
                                                             kv.format.page_size, every, kv.sink_slot)
        return self._write[ownership][self.tables.position[kv.layer]]
