"""Paged latent KV pool of one rank, per MLA layer (paper §2; DESIGN.md §3).

Each MLA layer owns a :class:`LayerKV`: a cache tensor ``[num_pages, page_size, d_c + d_r]``
(channels ``[0, d_c)`` the latent, ``[d_c, d_c + d_r)`` the rotary key, exactly the layout
:class:`~splash_core.interfaces.MLAKernels` reads), an optional indexer-key tensor
``[num_pages, page_size, indexer_dim]`` indexed by the same physical pages (so indexer keys move
with their page: attention itself stays dense, the keys are stored for sparse attention and
for switches), a free list and a block table per request.

A block table maps a request's *logical* pages (position // page_size) to physical pages of
this layer on this rank; -1 marks a logical page held elsewhere (CP) or not at all. Layers keep
separate free lists and tables because during a live switch layer i may already hold the
destination layout's pages while layer i+1 still holds the source's.

Switch API (used by the switch executor, and by :class:`~splash_core.runtime.model.Model`):
``alloc(request, logical_pages)``, ``free(request, logical_pages=None)``,
``pages_of(request)``, ``pack(kernels, request, logical_pages)`` and
``unpack(kernels, request, logical_pages, kv, indexer)``. ``alloc`` and ``unpack`` check
capacity before changing anything and raise :class:`PoolFullError`, so a failed call leaves
the layer as it was.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .. import ownership
from ..layouts import Layout, Ownership


class PoolFullError(RuntimeError):
    """Not enough free pages; raised before anything is written or allocated."""


def held_pages(layout: Layout, request_id: int, owner: int, pages, rank: int, T: int) -> np.ndarray:
    """The subset of logical ``pages`` of a request that ``rank`` holds in ``layout``.

    The placement rules of :mod:`splash_core.ownership`: every page on every rank (TP), all
    pages on the owner (DP, DOP), page p on rank ``(p + id) mod T`` (CP)."""
    pages = np.asarray(pages, dtype=np.int64)
    if layout.ownership is Ownership.ALL:
        return pages
    if layout.ownership is Ownership.OWNER:
        return pages if owner == rank else pages[:0]
    return pages[ownership.cp_rank_of_page(request_id, pages, T) == rank]


@dataclasses.dataclass(frozen=True)
class PageFormat:
    """What one page of one layer stores."""

    page_size: int
    kv_width: int  # d_c + d_r
    kv_dtype: torch.dtype
    indexer_width: int = 0  # 0: no indexer keys
    indexer_dtype: torch.dtype = torch.float32

    @property
    def kv_page_bytes(self) -> int:
        return self.page_size * self.kv_width * _itemsize(self.kv_dtype)

    @property
    def indexer_page_bytes(self) -> int:
        return self.page_size * self.indexer_width * _itemsize(self.indexer_dtype)

    @property
    def page_bytes(self) -> int:
        return self.kv_page_bytes + self.indexer_page_bytes


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """1-byte formats (fp8) as uint8, so indexed copies work on every device."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t


class LayerKV:
    """Pages, free list and block tables of one MLA layer on this rank."""

    def __init__(self, layer: int, num_pages: int, fmt: PageFormat, device):
        if num_pages < 1:
            raise ValueError(f"layer {layer}: a pool needs at least one page (got {num_pages})")
        self.layer = layer
        self.format = fmt
        self.device = device
        # Zero-filled: kernels read whole pages and mask by position, so unwritten slots must
        # hold finite values (0 * NaN would poison the output).
        self.kv = torch.zeros(num_pages, fmt.page_size, fmt.kv_width, dtype=fmt.kv_dtype, device=device)
        self.indexer = (torch.zeros(num_pages, fmt.page_size, fmt.indexer_width, dtype=fmt.indexer_dtype,
                                    device=device) if fmt.indexer_width else None)
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low page numbers first
        self._tables: dict[int, np.ndarray] = {}
        self.version = 0  # bumped on every change of a table; keys the block-table cache
        self._cache: tuple[int, dict] | None = None  # (version, {request ids: tables})

    # ---- accounting ----------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        return self.kv.shape[0]

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - self.free_pages

    def nbytes(self) -> dict[str, int]:
        """Bytes of the pages in use: latent+rotary KV and indexer keys."""
        return {"kv": self.used_pages * self.format.kv_page_bytes,
                "indexer": self.used_pages * self.format.indexer_page_bytes}

    @property
    def requests(self) -> list[int]:
        """Requests with at least one page here."""
        return [rid for rid, t in self._tables.items() if (t >= 0).any()]

    # ---- switch API ----------------------------------------------------------------------

    def pages_of(self, request: int) -> tuple[np.ndarray, np.ndarray]:
        """(logical pages, physical pages) of ``request`` held here, in logical order."""
        table = self._tables.get(request)
        if table is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        logical = np.flatnonzero(table >= 0)
        return logical, table[logical].astype(np.int64)

    def alloc(self, request: int, logical_pages) -> np.ndarray:
        """Physical pages for ``logical_pages`` of ``request`` (none may be held already).

        Raises :class:`PoolFullError` (changing nothing) when fewer pages are free."""
        logical = np.asarray(logical_pages, dtype=np.int64).reshape(-1)
        if logical.size == 0:
            return logical
        if len(self._free) < logical.size:
            raise PoolFullError(f"layer {self.layer}: request {request} needs {logical.size} pages, "
                                f"{len(self._free)} of {self.num_pages} are free")
        table = self._tables.get(request, np.zeros(0, np.int64))
        if table.size <= logical.max():
            table = np.concatenate([table, np.full(int(logical.max()) + 1 - table.size, -1, np.int64)])
        if np.unique(logical).size != logical.size or (table[logical] >= 0).any():
            raise ValueError(f"layer {self.layer}: request {request} already holds some of pages {logical.tolist()}")
        physical = np.array(self._free[-logical.size:][::-1], dtype=np.int64)
        del self._free[-logical.size:]
        table[logical] = physical
        self._tables[request] = table
        self.version += 1
        return physical

    def free(self, request: int, logical_pages=None) -> int:
        """Return pages of ``request`` (all it holds by default) to the free list; returns how many."""
        table = self._tables.get(request)
        if table is None:
            return 0
        logical = np.flatnonzero(table >= 0) if logical_pages is None else np.asarray(logical_pages, np.int64)
        logical = logical[logical < table.size]
        physical = table[logical]
        physical = physical[physical >= 0]
        table[logical] = -1
        self._free.extend(physical[::-1].tolist())
        if not (table >= 0).any():
            del self._tables[request]
        self.version += 1
        return int(physical.size)

    def pack(self, kernels, request: int, logical_pages=None):
        """(logical pages, kv [n, page_size, W], indexer [n, page_size, I] or None) of ``request``."""
        logical, physical = self.pages_of(request)
        if logical_pages is not None:
            wanted = np.asarray(logical_pages, dtype=np.int64)
            missing = np.setdiff1d(wanted, logical)
            if missing.size:
                raise ValueError(f"layer {self.layer}: request {request} holds no pages {missing.tolist()} here")
            physical = self._tables[request][wanted]
            logical = wanted
        index = torch.as_tensor(physical, device=self.device)
        kv = kernels.pack(_byte_view(self.kv), index).view(self.kv.dtype)
        idx = kernels.pack(_byte_view(self.indexer), index).view(self.indexer.dtype) if self.indexer is not None else None
        return logical, kv, idx

    def unpack(self, kernels, request: int, logical_pages, kv, indexer=None) -> np.ndarray:
        """Allocate ``logical_pages`` of ``request`` and write packed pages into them."""
        physical = self.alloc(request, logical_pages)
        index = torch.as_tensor(physical, device=self.device)
        kernels.unpack(_byte_view(self.kv), index, _byte_view(kv.to(self.kv.dtype)))
        if self.indexer is not None:
            if indexer is None:
                raise ValueError(f"layer {self.layer}: this pool stores indexer keys; unpack needs them")
            kernels.unpack(_byte_view(self.indexer), index, _byte_view(indexer.to(self.indexer.dtype)))
        return physical

    # ---- step path -----------------------------------------------------------------------

    def slots(self, request_ids: tuple[int, ...], row_req: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Flat cache slot (page * page_size + offset) of each row: request ``request_ids[row_req]``,
        position ``positions``. Every row's page must be held here."""
        dense = self._tables_for(request_ids)[0]
        page_size = self.format.page_size
        pages = positions // page_size
        if pages.size and pages.max() >= dense.shape[1]:
            raise RuntimeError(f"layer {self.layer}: a row writes page {int(pages.max())}, beyond every held page")
        physical = dense[row_req, pages]
        if (physical < 0).any():
            bad = int(np.flatnonzero(physical < 0)[0])
            raise RuntimeError(f"layer {self.layer}: request {request_ids[row_req[bad]]} writes page "
                               f"{int(pages[bad])}, which it holds no slot for here")
        return physical * page_size + positions % page_size

    def write(self, slots: torch.Tensor, kv: torch.Tensor, indexer: torch.Tensor | None = None) -> None:
        """Store per-token entries kv [n, W] (and indexer keys [n, I]) at flat ``slots`` [n]."""
        flat = _byte_view(self.kv).view(-1, self.format.kv_width)
        flat.index_copy_(0, slots, _byte_view(kv.to(self.kv.dtype)))
        if self.indexer is not None and indexer is not None:
            flat = _byte_view(self.indexer).view(-1, self.format.indexer_width)
            flat.index_copy_(0, slots, _byte_view(indexer.to(self.indexer.dtype)))

    def block_table(self, request_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Kernel block table and page index [R, P] int32 (device) for ``request_ids`` in order:
        row i lists the pages request i holds here, -1 padded."""
        return self._tables_for(request_ids)[1]

    def _tables_for(self, request_ids: tuple[int, ...]):
        """(dense logical->physical table [R, P_max] on the host, device block table and page index),
        rebuilt only when a table changed (each request set a step asks for is kept until then)."""
        if self._cache is None or self._cache[0] != self.version:
            self._cache = (self.version, {})
        known = self._cache[1].get(request_ids)
        if known is not None:
            return known
        tables = [self._tables.get(rid, np.zeros(0, np.int64)) for rid in request_ids]
        dense = np.full((len(tables), max([t.size for t in tables], default=0)), -1, dtype=np.int64)
        held = [self.pages_of(rid) for rid in request_ids]
        width = max([lg.size for lg, _ in held], default=0)
        table = np.full((len(request_ids), width), -1, dtype=np.int32)
        index = np.full((len(request_ids), width), -1, dtype=np.int32)
        for i, (t, (logical, physical)) in enumerate(zip(tables, held)):  # per request, not per page
            dense[i, :t.size] = t
            table[i, :logical.size] = physical
            index[i, :logical.size] = logical
        value = (dense, (torch.as_tensor(table, device=self.device), torch.as_tensor(index, device=self.device)))
        self._cache[1][request_ids] = value
        return value


class KVPool:
    """The :class:`LayerKV` of every MLA layer on this rank, each with ``pages_per_layer`` pages."""

    def __init__(self, layers, pages_per_layer: int, fmt: PageFormat, device):
        self.format = fmt
        self.layers = {int(i): LayerKV(int(i), pages_per_layer, fmt, device) for i in layers}

    def __getitem__(self, layer: int) -> LayerKV:
        try:
            return self.layers[layer]
        except KeyError:
            raise KeyError(f"layer {layer} has no KV pool (MLA layers: {sorted(self.layers)})") from None

    @staticmethod
    def pages_for_budget(budget_bytes: float, fmt: PageFormat, num_layers: int) -> int:
        """Pages per layer that ``budget_bytes`` holds over ``num_layers`` layers."""
        return int(budget_bytes // (fmt.page_bytes * max(num_layers, 1)))

    def nbytes(self) -> dict[str, int]:
        """Bytes of pages in use over all layers: {'kv': ..., 'indexer': ...}."""
        out = {"kv": 0, "indexer": 0}
        for layer in self.layers.values():
            for key, value in layer.nbytes().items():
                out[key] += value
        return out

    def release(self, request: int) -> None:
        """Free every page of ``request`` in every layer (the request finished)."""
        for layer in self.layers.values():
            layer.free(request)
