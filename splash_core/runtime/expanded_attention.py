"""Prefill rows that attend in the expanded form (:mod:`splash_core.planning.attention_forms`): their
request's visible keys are read from the paged cache, expanded through kv_b into per-head keys
and values, and attended by the backend's ``expanded`` kernel (the contract in
:class:`~splash_core.platform.interfaces.MLAKernels`); the result is already in value space [n, H, d_v].

Keys are expanded in passes of at most :data:`PASS_BYTES` of expanded keys and values (a 128K
history at 128 heads would take 8 GiB at once), each pass's partial results merged by
log-sum-exp. Which keys a request sees comes from the host's copy of the block table, so
nothing waits for the device; layers whose pages are equal share one upload.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..model.fp8_cache import cache_layout, dequantize
from ..platform.device import to_device
from .kv_pool import LayerKV

PASS_BYTES = 1 << 30


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
                   put(which, torch.int32), put(row_pos[exp], torch.int32), slots, last)


@dataclasses.dataclass(frozen=True)
class ExpandedKeys:
    """The visible keys of the expanded requests in one layer, request after request."""

    slots: torch.Tensor  # [M] int64 flat cache slots (page * page_size + offset)
    positions: torch.Tensor  # [M] int32
    starts: np.ndarray  # [E + 1]: keys of request e are starts[e]:starts[e + 1]


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
        uploads[key] = (to_device(flat, device), to_device(np.concatenate(positions), device, torch.int32))
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return ExpandedKeys(*uploads[key], starts)


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
    for a in range(0, total, width):
        b = min(a + width, total)
        entries = cache.index_select(0, keys.slots[a:b])
        entries = dequantize(entries, scaled).to(q.dtype) if scaled is not None else entries.to(q.dtype)
        expanded = (entries[:, :d_c] @ kv_b.t()).view(b - a, heads, -1)
        starts = to_device((np.clip(keys.starts, a, b) - a).astype(np.int32), q.device, torch.int32)
        out, lse = kernels.expanded(q, expanded[..., :d_n], entries[:, d_c:], expanded[..., d_n:], rows.q_req,
                                    rows.q_pos, starts, keys.positions[a:b], scale)
        outs.append(out)
        lses.append(lse)
    if len(outs) == 1:
        return outs[0], lses[0]
    return kernels.merge(torch.stack(outs), torch.stack(lses))
