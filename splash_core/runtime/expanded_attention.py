"""Prefill rows that attend in the expanded form (:mod:`splash_core.planning.attention_forms`): their
request's visible keys are read from the paged cache, expanded through kv_b into per-head keys
and values, and attended by the backend's ``expanded`` kernel (the contract in
:class:`~splash_core.platform.interfaces.MLAKernels`); the result is already in value space [n, H, d_v].

Keys are expanded in passes of at most :data:`PASS_BYTES` of expanded keys and values (a 128K
history at 128 heads would take 8 GiB at once), each pass's partial results merged by
log-sum-exp; a pass cuts a request's keys at multiples of :data:`PASS_ALIGN` from its first key
(where a pass holds that many), so rows that see a pass's keys as history alone see whole shape
buckets (:mod:`splash_core.kernels.expanded_buckets`). Which keys a request sees comes from the
host's copy of the block table, so nothing waits for the device; the kernel gets the index arrays
on the host too (:class:`~splash_core.kernels.expanded_plan.HostIndex`, for a provider that plans
there); layers whose keys are equal share one upload and one host index per pass.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..kernels.expanded_plan import HostIndex, call_expanded
from ..model.fp8_cache import cache_layout, dequantize
from ..platform.device import to_device
from .kv_pool import LayerKV

PASS_BYTES = 1 << 30
PASS_ALIGN = 4096  # keys; a multiple of the shape buckets' granularity


@dataclasses.dataclass(frozen=True)
class FormRows:
    """The rows of one attention view (one ownership's rows on this rank) split by form."""

    expanded: torch.Tensor  # [n_e] int64: rows (of the view) that attend expanded
    absorbed: torch.Tensor  # [n_a] int64: the others
    absorbed_req: torch.Tensor  # [n_a] int32: their request slot in the view's block table
    absorbed_pos: torch.Tensor  # [n_a] int32
    q_req: torch.Tensor  # [n_e] int32: each expanded row's request among ``slots``
    q_pos: torch.Tensor  # [n_e] int32
    slots: np.ndarray  # [E]: the view's request slots that attend expanded
    last_pos: np.ndarray  # [E]: the last position any of their rows has
    host_req: np.ndarray  # [n_e]: ``q_req`` on the host
    host_pos: np.ndarray  # [n_e]: ``q_pos`` on the host
    expanded_run: slice | None = None  # ``expanded`` as a slice where its rows are consecutive
    absorbed_run: slice | None = None  # ``absorbed`` likewise

    def take(self, x: torch.Tensor, *, expanded: bool) -> torch.Tensor:
        """The expanded (or absorbed) rows of ``x``: a view where they are consecutive."""
        run, index = (self.expanded_run, self.expanded) if expanded else (self.absorbed_run, self.absorbed)
        return x[run] if run is not None else x.index_select(0, index)

    def put(self, dst: torch.Tensor, src: torch.Tensor, *, expanded: bool) -> None:
        """Write ``src`` into the expanded (or absorbed) rows of ``dst``."""
        run, index = (self.expanded_run, self.expanded) if expanded else (self.absorbed_run, self.absorbed)
        if run is not None:
            dst[run] = src
        else:
            dst.index_copy_(0, index, src)

    @classmethod
    def split(cls, row_req: np.ndarray, row_pos: np.ndarray, expanded_slots: np.ndarray, device) -> "FormRows | None":
        """None when no row of the view attends expanded."""
        is_exp = np.isin(row_req, expanded_slots)
        if not is_exp.any():
            return None
        exp, ab = np.flatnonzero(is_exp), np.flatnonzero(~is_exp)
        slots = np.unique(row_req[exp])
        which = np.searchsorted(slots, row_req[exp])
        last = np.full(slots.size, -1, dtype=np.int64)
        np.maximum.at(last, which, row_pos[exp])
        put = lambda a, dtype=torch.int64: to_device(np.ascontiguousarray(a), device, dtype)  # noqa: E731
        return cls(put(exp), put(ab), put(row_req[ab], torch.int32), put(row_pos[ab], torch.int32),
                   put(which, torch.int32), put(row_pos[exp], torch.int32), slots, last, which, row_pos[exp],
                   _run(exp), _run(ab))


def _run(rows: np.ndarray) -> slice | None:
    """``rows`` (ascending) as a slice where they are consecutive (a prefill chunk's request usually is)."""
    if rows.size and rows[-1] - rows[0] + 1 == rows.size:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return None


@dataclasses.dataclass(frozen=True)
class ExpandedKeys:
    """The visible keys of the expanded requests in one layer, request after request."""

    slots: torch.Tensor  # [M] int64 flat cache slots (page * page_size + offset)
    positions: torch.Tensor  # [M] int32
    starts: np.ndarray  # [E + 1]: keys of request e are starts[e]:starts[e + 1]
    host_positions: np.ndarray  # [M]: ``positions`` on the host
    passes: dict  # pass width -> (rows, their passes): shared by every layer with these keys


def visible_keys(tables: tuple[np.ndarray, np.ndarray], rows: FormRows, page_size: int, device,
                 uploads: dict) -> ExpandedKeys:
    """Keys of ``rows``' expanded requests from the host block table and page index [R, W]
    (:meth:`LayerKV.host_block_table`): every held page that starts at or before the request's last
    row. ``uploads`` keeps what was uploaded for equal keys (other layers of the step)."""
    table, index = tables
    offsets = np.arange(page_size)
    slots, positions, counts = [], [], []
    for slot, last in zip(rows.slots, rows.last_pos):
        keep = (table[slot] >= 0) & (index[slot].astype(np.int64) * page_size <= last)
        pages, logical = table[slot][keep].astype(np.int64), index[slot][keep].astype(np.int64)
        slots.append((pages[:, None] * page_size + offsets).ravel())
        positions.append((logical[:, None] * page_size + offsets).ravel())
        counts.append(pages.size * page_size)
    flat = np.concatenate(slots)
    key = flat.tobytes()
    if key not in uploads:
        host_positions = np.concatenate(positions)
        uploads[key] = (to_device(flat, device), to_device(host_positions, device, torch.int32), host_positions, {})
    slots, positions, host_positions, passes = uploads[key]
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return ExpandedKeys(slots, positions, starts, host_positions, passes)


def pass_bounds(starts: np.ndarray, width: int, align: int = PASS_ALIGN) -> list[tuple[int, int]]:
    """Key ranges ``[a, b)`` of at most ``width`` keys covering all of them, cut at request
    boundaries or at multiples of ``align`` from a request's first key (where ``width >= align``)."""
    total, step = int(starts[-1]), align if width >= align else 1
    bounds, a = [], 0
    while a < total:
        b = min(a + width, total)
        if b < total:
            first = int(starts[np.searchsorted(starts, b, side="right") - 1])  # of the request holding key b
            b = first + (b - first) // step * step  # > a: an aligned cut or a request's start lies in (a, a + width]
        bounds.append((a, b))
        a = b
    return bounds


def _passes(keys: ExpandedKeys, rows: FormRows, width: int, device) -> list[tuple[int, int, torch.Tensor, HostIndex]]:
    """(first key, end, device k_start, host index) of every pass, made once for these keys and rows."""
    entry = keys.passes.get(width)
    if entry is None or entry[0] is not rows:
        made = []
        for a, b in pass_bounds(keys.starts, width, PASS_ALIGN):
            starts = (np.clip(keys.starts, a, b) - a).astype(np.int32)
            host = HostIndex(rows.host_req, rows.host_pos, starts, keys.host_positions[a:b])
            made.append((a, b, to_device(starts, device, torch.int32), host))
        entry = keys.passes[width] = (rows, made)
    return entry[1]


def attend_expanded(kernels, q: torch.Tensor, kv: LayerKV, keys: ExpandedKeys, rows: FormRows,
                    kv_b: torch.Tensor, d_n: int, scale: float, pass_bytes: int | None = None):
    """(out [n_e, H, d_v] in q's dtype, lse [n_e, H] float32) of the expanded rows' queries ``q``
    [n_e, H, d_n + d_r] (q_nope ++ rotated q_rope) over their keys, expanded through ``kv_b``
    [H * (d_n + d_v), d_c] (W_UK then W_UV per head), in passes of ``pass_bytes`` (None:
    :data:`PASS_BYTES`) of expanded keys."""
    n, heads, _ = q.shape
    d_c = kv_b.shape[1]
    per_key = heads * (kv_b.shape[0] // heads) * q.element_size()
    width = max(1, (pass_bytes or PASS_BYTES) // per_key)
    total = int(keys.starts[-1])
    cache = kv.kv.view(-1, kv.kv.shape[-1])
    if total == 0:  # a CP rank holding none of these requests' pages
        return (q.new_zeros(n, heads, kv_b.shape[0] // heads - d_n),
                torch.full((n, heads), float("-inf"), dtype=torch.float32, device=q.device))
    scaled = cache_layout(kv.kv, d_c, q.shape[2] - d_n)
    outs, lses = [], []
    for a, b, starts, host in _passes(keys, rows, width, q.device):
        entries = cache.index_select(0, keys.slots[a:b])
        entries = dequantize(entries, scaled, q.dtype) if scaled is not None else entries.to(q.dtype)
        expanded = (entries[:, :d_c] @ kv_b.t()).view(b - a, heads, -1)
        out, lse = call_expanded(kernels.expanded, host, q, expanded[..., :d_n], entries[:, d_c:], expanded[..., d_n:],
                                 rows.q_req, rows.q_pos, starts, keys.positions[a:b], scale)
        outs.append(out)
        lses.append(lse)
    if len(outs) == 1:
        return outs[0], lses[0]
    return kernels.merge(torch.stack(outs), torch.stack(lses))
