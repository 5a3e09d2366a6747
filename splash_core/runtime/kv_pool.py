"""Paged latent KV pool of one rank, per MLA layer (paper §2; docs/design.md §3).

Each MLA layer owns a :class:`LayerKV`: a cache tensor ``[num_pages, page_size, d_c + d_r]``
(channels ``[0, d_c)`` the latent, ``[d_c, d_c + d_r)`` the rotary key, exactly the layout
:class:`~splash_core.platform.interfaces.MLAKernels` reads; in the scaled-fp8 format a uint8 tensor
``[num_pages, page_size, token_bytes]``, :mod:`~splash_core.model.kv_format`), an optional indexer-key tensor
``[num_pages, page_size, indexer_dim]`` (an fp8 key with scales: uint8, the same scaled layout
without a rotary part) indexed by the same physical pages (so indexer keys move with their page;
only the layers that store them: GLM-5's shared-indexer layers reuse an earlier layer's top-k and
get none, as their switch plans move none and the memory plan and the cost model count none), and
the block tables and free pages of those pages
(:class:`~splash_core.runtime.block_tables.BlockTables`, which it extends). Layers keep separate
free pages and tables because during a live switch layer i may already hold the destination
layout's pages while layer i+1 still holds the source's.

Switch API (used by the switch executor, and by :class:`~splash_core.runtime.model.Model`):
``alloc(request, logical_pages)``, ``free(request, logical_pages=None)``,
``pages_of(request)``, ``pack(kernels, request, logical_pages)`` and
``unpack(kernels, request, logical_pages, kv, indexer)``; for many requests at once, on
:class:`~splash_core.runtime.page_keys.PageKeys` prepared once per switch plan:
``lookup(keys)``, ``alloc_keys(keys)`` and ``free_keys(keys)``. Allocation checks capacity
before changing anything and raises :class:`PoolFullError`, so a failed call leaves the layer
as it was. Step path: ``slots``, ``write`` and ``block_table`` (kept until the pages change);
:func:`to_device` copies host index arrays to the device without waiting for queued kernels.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..layouts import Layout, Ownership, State
from ..model.kv_format import ScaledFP8
from ..model.ops import write_rows
from ..planning import ownership
from ..platform.device import to_device
from .block_tables import BlockTables
from .page_keys import PageKeys, PoolFullError

__all__ = ["KVPool", "LayerKV", "PageFormat", "PoolFullError", "held_pages", "to_device"]


def held_pages(layout: Layout, request_id: int, owner: int, pages, rank: int, T: int) -> np.ndarray:
    """The subset of logical ``pages`` of a request that ``rank`` holds in ``layout``.

    The placement rules of :mod:`splash_core.planning.ownership`: every page on every rank (TP), all
    pages on the owner (DP, DOP), page p on rank ``(p + id) mod T`` (CP)."""
    pages = np.asarray(pages, dtype=np.int64)
    if layout.ownership is Ownership.ALL:
        return pages
    if layout.ownership is Ownership.OWNER:
        return pages if owner == rank else pages[:0]
    return pages[ownership.cp_rank_of_page(request_id, pages, T) == rank]


@dataclasses.dataclass(frozen=True)
class PageFormat:
    """What one page of one layer stores. :meth:`scaled_fp8` builds the scaled-fp8 format."""

    page_size: int
    kv_width: int  # d_c + d_r (scaled fp8: bytes per token)
    kv_dtype: torch.dtype  # scaled fp8: uint8
    indexer_width: int = 0  # 0: no indexer keys
    indexer_dtype: torch.dtype = torch.float32
    scaled: ScaledFP8 | None = None  # the scaled-fp8 layout of a token's entry; None: an element format
    indexer_scaled: ScaledFP8 | None = None  # likewise for the indexer key (no rotary part)

    def __post_init__(self):
        for what, layout, width, dtype in (("page", self.scaled, self.kv_width, self.kv_dtype),
                                           ("indexer page", self.indexer_scaled, self.indexer_width,
                                            self.indexer_dtype)):
            if layout is not None and (dtype != torch.uint8 or width != layout.token_bytes):
                raise ValueError(f"a scaled-fp8 {what} stores {layout.token_bytes} bytes per token as uint8 "
                                 f"(got width {width}, {dtype})")

    @classmethod
    def scaled_fp8(cls, page_size: int, layout: ScaledFP8, indexer_width: int = 0,
                   indexer_dtype: torch.dtype = torch.float32, indexer_scaled: ScaledFP8 | None = None) -> "PageFormat":
        return cls(page_size, layout.token_bytes, torch.uint8, indexer_width, indexer_dtype, layout, indexer_scaled)

    def without_indexer(self) -> "PageFormat":
        """This format with no indexer keys (a layer that stores none)."""
        return dataclasses.replace(self, indexer_width=0, indexer_dtype=torch.float32, indexer_scaled=None)

    @property
    def kv_page_bytes(self) -> int:
        return self.page_size * self.kv_width * self.kv_dtype.itemsize

    @property
    def indexer_page_bytes(self) -> int:
        return self.page_size * self.indexer_width * self.indexer_dtype.itemsize

    @property
    def page_bytes(self) -> int:
        return self.kv_page_bytes + self.indexer_page_bytes


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """1-byte formats (fp8) as uint8, so indexed copies work on every device."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t


_ALIGN = 512  # bytes: every page tensor in a shared buffer starts aligned for any dtype and copy engine


def _aligned(nbytes: int) -> int:
    return -(-int(nbytes) // _ALIGN) * _ALIGN


def _view(buffer: torch.Tensor, offset: int, shape, dtype: torch.dtype) -> torch.Tensor:
    nbytes = int(np.prod(shape)) * dtype.itemsize
    return buffer[offset: offset + nbytes].view(dtype).view(shape)


class LayerKV(BlockTables):
    """Pages of one MLA layer on this rank: the page tensors, and (inherited) their block tables
    and free pages.

    The page tensors hold one page more than the tables hand out: the *sink* (physical page
    ``num_pages``, :attr:`sink_slot`), where a captured step writes the cache entries of the
    rows it pads a batch with, so every row writes somewhere and no shape depends on the batch."""

    def __init__(self, layer: int, num_pages: int, fmt: PageFormat, device, buffer: torch.Tensor | None = None,
                 offset: int = 0):
        """``buffer``/``offset``: the page tensors are views of a shared uint8 buffer (zero-filled)
        from byte ``offset`` on, KV then indexer keys (:meth:`KVPool.layer_bytes` each), instead
        of allocations of their own; :attr:`offsets` then says where each starts."""
        super().__init__(layer, num_pages)
        self.format = fmt
        self.device = device
        kv_shape = (num_pages + 1, fmt.page_size, fmt.kv_width)
        idx_shape = (num_pages + 1, fmt.page_size, fmt.indexer_width)
        # Zero-filled: kernels read whole pages and mask by position, so unwritten slots must
        # hold finite values (0 * NaN would poison the output).
        if buffer is None:
            self.offsets = None
            self.kv = torch.zeros(kv_shape, dtype=fmt.kv_dtype, device=device)
            self.indexer = torch.zeros(idx_shape, dtype=fmt.indexer_dtype, device=device) if fmt.indexer_width else None
        else:
            kv_bytes = (num_pages + 1) * fmt.kv_page_bytes
            self.offsets = {State.KV: offset}
            if fmt.indexer_width:
                self.offsets[State.INDEXER] = offset + _aligned(kv_bytes)
            self.kv = _view(buffer, offset, kv_shape, fmt.kv_dtype)
            self.indexer = (_view(buffer, self.offsets[State.INDEXER], idx_shape, fmt.indexer_dtype)
                            if fmt.indexer_width else None)
        self._cache: tuple[int, dict] | None = None  # (version, {request ids: tables})

    @property
    def sink_slot(self) -> int:
        """A flat cache slot no request's page holds: writes nobody reads go there."""
        return self.num_pages * self.format.page_size

    def nbytes(self) -> dict[str, int]:
        """Bytes of the pages in use: latent+rotary KV and indexer keys."""
        return {"kv": self.used_pages * self.format.kv_page_bytes,
                "indexer": self.used_pages * self.format.indexer_page_bytes}

    # ---- switch API (the rest: BlockTables) -------------------------------------------------

    def pack(self, kernels, request: int, logical_pages=None):
        """(logical pages, kv [n, page_size, W], indexer [n, page_size, I] or None) of ``request``."""
        logical, physical = self.pages_of(request)
        if logical_pages is not None:
            wanted = np.asarray(logical_pages, dtype=np.int64)
            missing = np.setdiff1d(wanted, logical)
            if missing.size:
                raise ValueError(f"layer {self.layer}: request {request} holds no pages {missing.tolist()} here")
            physical = self.lookup(PageKeys.one(request, wanted))
            logical = wanted
        index = torch.as_tensor(physical, device=self.device)
        kv = kernels.pack(_byte_view(self.kv), index).view(self.kv.dtype)
        idx = kernels.pack(_byte_view(self.indexer), index).view(self.indexer.dtype) if self.indexer is not None else None
        return logical, kv, idx

    def unpack(self, kernels, request: int, logical_pages, kv, indexer=None) -> np.ndarray:
        """Allocate ``logical_pages`` of ``request`` and write packed pages into them (indexer keys
        exactly where this layer stores them; refused before anything is allocated otherwise)."""
        if (self.indexer is None) != (indexer is None):
            raise ValueError(f"layer {self.layer}: this pool stores {'no ' if self.indexer is None else ''}indexer "
                             f"keys; unpack was given {'none' if indexer is None else 'some'}")
        physical = self.alloc(request, logical_pages)
        index = torch.as_tensor(physical, device=self.device)
        kernels.unpack(_byte_view(self.kv), index, _byte_view(kv.to(self.kv.dtype)))
        if self.indexer is not None:
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
        physical = dense[row_req, pages].astype(np.int64)
        if (physical < 0).any():
            bad = int(np.flatnonzero(physical < 0)[0])
            raise RuntimeError(f"layer {self.layer}: request {request_ids[row_req[bad]]} writes page "
                               f"{int(pages[bad])}, which it holds no slot for here")
        return physical * page_size + positions % page_size

    def write(self, slots: torch.Tensor, kv: torch.Tensor | None, indexer: torch.Tensor | None = None) -> None:
        """Store per-token entries kv [n, W] (and indexer keys [n, I]) at flat ``slots`` [n]
        (kv None: only the indexer keys, the entries having been written already)."""
        if kv is not None:
            write_rows(self.kv, slots, kv, self.format.scaled)
        if self.indexer is not None and indexer is not None:
            write_rows(self.indexer, slots, indexer, self.format.indexer_scaled)

    def block_table(self, request_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Kernel block table and page index [R, P] int32 (device) for ``request_ids`` in order:
        row i lists the pages request i holds here, -1 padded."""
        return self._tables_for(request_ids)[1]

    def host_block_table(self, request_ids: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`block_table` as the host holds it (numpy), for what the host plans from it."""
        return self._tables_for(request_ids)[2]

    def _tables_for(self, request_ids: tuple[int, ...]):
        """(dense logical->physical table [R, P_max] on the host, device block table and page index),
        rebuilt only when a table changed (each request set a step asks for is kept until then)."""
        if self._cache is None or self._cache[0] != self.version:
            self._cache = (self.version, {})
        known = self._cache[1].get(request_ids)
        if known is not None:
            return known
        dense, table, index = self.compact(request_ids)
        value = (dense, (to_device(table, self.device), to_device(index, self.device)), (table, index))
        self._cache[1][request_ids] = value
        return value


class KVPool:
    """The :class:`LayerKV` of every MLA layer on this rank, each with ``pages_per_layer`` pages of
    ``fmt``, less the indexer keys in the ``keyless`` layers (GLM-5's shared-indexer layers).

    With ``memory`` (a :class:`~splash_core.platform.interfaces.PeerMemory`), every layer's pages live in
    one buffer from it (:attr:`buffer`, laid out alike on every rank of a group with the same
    pool), which a switch shares with the group so ranks pull pages from each other."""

    def __init__(self, layers, pages_per_layer: int, fmt: PageFormat, device, memory=None, keyless=()):
        self.format = fmt  # of a layer storing indexer keys; each layer's own: LayerKV.format
        layers = [int(i) for i in layers]
        stray = sorted(set(int(i) for i in keyless) - set(layers))
        if stray:
            raise ValueError(f"layers {stray} store no indexer keys but have no KV pool (MLA layers: {layers})")
        formats = {i: fmt.without_indexer() if i in keyless else fmt for i in layers}
        self.memory = memory if layers else None
        self.buffer = None
        if self.memory is None:
            self.layers = {i: LayerKV(i, pages_per_layer, formats[i], device) for i in layers}
            return
        sizes = [self.layer_bytes(pages_per_layer, formats[i]) for i in layers]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.buffer = self.memory.allocate(int(starts[-1]))
        self.layers = {i: LayerKV(i, pages_per_layer, formats[i], device, self.buffer, int(starts[k]))
                       for k, i in enumerate(layers)}

    @staticmethod
    def layer_bytes(pages_per_layer: int, fmt: PageFormat) -> int:
        """Bytes one layer's pages take in a shared buffer (KV, then indexer keys, each aligned;
        the sink page included)."""
        pages = pages_per_layer + 1
        return _aligned(pages * fmt.kv_page_bytes) + _aligned(pages * fmt.indexer_page_bytes)

    def __getitem__(self, layer: int) -> LayerKV:
        try:
            return self.layers[layer]
        except KeyError:
            raise KeyError(f"layer {layer} has no KV pool (MLA layers: {sorted(self.layers)})") from None

    @staticmethod
    def pages_for_budget(budget_bytes: float, fmt: PageFormat, num_layers: int) -> int:
        """Pages per layer that ``budget_bytes`` holds over ``num_layers`` layers, all of ``fmt``."""
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
