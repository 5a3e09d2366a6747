"""Every paged layer's kernel block tables, resident on the device, updated entry by entry: what
a captured decode step reads its pages through (issue 22 §1).

One tensor ``[layers, rows, width]`` (int32) of physical pages and one of the logical page each
entry is, in the :class:`~splash_core.platform.interfaces.MLAKernels` format: row ``r`` lists, in logical
order, the pages the request in row ``r`` holds in that layer on this rank, -1 padded. A request
keeps its row from its first captured step until it is released (rows are assigned and freed in
the order every rank sees, so every rank agrees on them); row 0 is never assigned, so padding
rows that read it see no key.

The host keeps a mirror of what the device holds. Before a step, :meth:`DeviceTables.prepare`
compares the rows of the requests whose pages changed since (each layer's
:meth:`~splash_core.runtime.block_tables.BlockTables.drain_changes`) with the mirror and writes
only the entries that differ, all layers in one scatter: a decode step that opens a page writes
one entry per layer; a switch or a prefill rewrites the rows it changed. The tables grow (by
powers of two, never shrink) when a step needs more rows or a wider table; growing reallocates
them, which :attr:`epoch` counts, since graphs captured on the old tensors read stale addresses.
"""

from __future__ import annotations

import numpy as np
import torch

from ..platform.device import to_device
from .kv_pool import LayerKV


def _rising(n: int, floor: int) -> int:
    """The power of two >= max(n, floor)."""
    return 1 << max(int(n) - 1, int(floor) - 1, 0).bit_length()


class DeviceTables:
    """The block tables of ``layers`` (one rank's :class:`LayerKV`) on ``device``."""

    def __init__(self, layers: list[LayerKV], device, *, min_width: int = 16, rows: int = 2):
        """``rows``: the rows to start with (a row per request that can run at once, plus row 0),
        so graphs captured at start-up survive the first requests; ``min_width`` the narrowest."""
        self.layers = list(layers)
        self.position = {kv.layer: k for k, kv in enumerate(self.layers)}  # layer index -> tensor row
        self.device = device
        self.min_width = min_width
        self.row_of: dict[int, int] = {}  # request -> row
        self._spare: list[int] = []  # released rows, reused last-released first
        self._fresh = 1  # the next row never assigned
        self.epoch = 0  # bumped whenever the tensors are reallocated
        self.pages = self.index = None
        self._mirror = np.zeros((len(self.layers), 0, 0), np.int32)
        self._mirror_index = self._mirror.copy()
        self._held = np.zeros((len(self.layers), 0), np.int64)  # entries listed per (layer, row)
        self._allocate(_rising(rows, 2), min_width)
        for kv in self.layers:
            kv.follow_changes()

    @property
    def nbytes(self) -> int:
        """Device bytes of the tables (pages and page indices)."""
        return 2 * self._mirror.size * 4

    def _allocate(self, rows: int, width: int) -> None:
        layers, old_rows, old_width = self._mirror.shape
        mirror = np.full((layers, rows, width), -1, np.int32)
        index = np.zeros((layers, rows, width), np.int32)
        held = np.zeros((layers, rows), np.int64)
        mirror[:, :old_rows, :old_width] = self._mirror
        index[:, :old_rows, :old_width] = self._mirror_index
        held[:, :old_rows] = self._held
        self._mirror, self._mirror_index, self._held = mirror, index, held
        self.rows, self.width = rows, width  # rows of the tables, entries a row
        self.pages = to_device(mirror, self.device)
        self.index = to_device(index, self.device)
        self.epoch += 1

    def prepare(self, request_ids, width: int) -> np.ndarray:
        """Give every request of ``request_ids`` a row, make the tables at least ``width`` entries
        wide, and bring every layer's rows up to date on the device; the requests' rows, in order.
        ``width`` must come from what every rank knows (the batch), so every rank grows alike."""
        new = [int(r) for r in request_ids if int(r) not in self.row_of]
        rows = self._fresh + max(0, len(new) - len(self._spare))
        if rows > self.rows or width > self.width:
            self._allocate(_rising(max(rows, self.rows), 2), _rising(max(width, self.width), self.min_width))
        for rid in new:
            if self._spare:
                self.row_of[rid] = self._spare.pop()
            else:
                self.row_of[rid], self._fresh = self._fresh, self._fresh + 1
        flat, pages, index = [], [], []
        for k, kv in enumerate(self.layers):
            for rid in kv.drain_changes().union(new):
                row = self.row_of.get(rid)
                if row is not None:
                    self._update_row(k, kv, rid, row, flat, pages, index)
        if flat:
            update = to_device(np.stack([np.concatenate(flat), np.concatenate(pages), np.concatenate(index)]),
                               self.device, torch.int64)
            self.pages.view(-1).index_copy_(0, update[0], update[1].to(torch.int32))
            self.index.view(-1).index_copy_(0, update[0], update[2].to(torch.int32))
        return np.array([self.row_of[int(r)] for r in request_ids], dtype=np.int64)

    def _update_row(self, k: int, kv: LayerKV, rid: int, row: int, flat, pages, index) -> None:
        """Queue the entries of ``rid``'s row in layer position ``k`` that differ from the mirror."""
        logical, physical = kv.pages_of(rid)
        n, before = logical.size, int(self._held[k, row])
        if n > self.width:
            raise RuntimeError(f"layer {kv.layer}: request {rid} holds {n} pages here, more than the "
                               f"{self.width} its batch's contexts call for")
        span = max(n, before)
        want = np.full(span, -1, np.int32)
        want[:n] = physical
        want_index = np.zeros(span, np.int32)
        want_index[:n] = logical
        have, have_index = self._mirror[k, row, :span], self._mirror_index[k, row, :span]
        differ = np.flatnonzero((have != want) | (have_index != want_index))
        if differ.size:
            have[differ], have_index[differ] = want[differ], want_index[differ]
            flat.append((k * self.rows + row) * self.width + differ)
            pages.append(want[differ].astype(np.int64))
            index.append(want_index[differ].astype(np.int64))
        self._held[k, row] = n

    def release(self, request: int) -> None:
        """Forget ``request`` (finished): its row empties on the device and goes back for reuse."""
        row = self.row_of.pop(int(request), None)
        if row is None:
            return
        self._mirror[:, row], self._mirror_index[:, row], self._held[:, row] = -1, 0, 0
        self.pages[:, row].fill_(-1)
        self.index[:, row].fill_(0)
        self._spare.append(row)

    def write_slots(self, row: torch.Tensor, positions: torch.Tensor, page_size: int, every: int,
                    sink: int) -> torch.Tensor:
        """Flat cache slots [layers, n] (device) of rows reading table row ``row`` [n] at
        ``positions`` [n] (int64): the page of a position is entry ``page // every`` of its row
        (every = 1 where ranks hold a prefix of the pages, T under CP, where this rank holds every
        T-th); a row whose page is not that entry (not held here, or a padding row) writes to
        ``sink``. Device operations only: a captured step computes them inside the graph."""
        page = positions // page_size
        entry = (page // every).clamp(max=self.width - 1)
        physical = self.pages[:, row, entry]
        held = (physical >= 0) & (self.index[:, row, entry] == page)
        return torch.where(held, physical.long() * page_size + positions % page_size, sink)
