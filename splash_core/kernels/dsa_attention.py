"""Absorbed-MLA attention over only the keys the DSA indexer selected, in Triton (decode and extend).

Each query row attends to its own list of key slots (``slot * page_size + offset`` in its
request's block table, as :mod:`.dsa_indexer` selects them; -1 pads), so rows of one request
share no key tile and a program takes one row times ``tile.heads`` heads (the M side of the
dots: every head of a row reads the same gathered keys). Decode and extend rows are the same
computation; extend only has more rows. The latent and rotary parts of the 576-wide key are
separate power-of-two dots, the latent tile doubling as the values, and a uint8 cache is read
in the scaled-fp8 format exactly as :mod:`.attention` reads it.

The result is ``(out [N, H, v_dim], lse [N, H])`` like the dense kernels, so a CP rank's partial
result over its own selected keys merges with :mod:`.merge`. A row with nothing selected gets
out 0 and lse -inf. Causality is the selection's: every listed slot is attended (the indexer
lists only visible keys, each once); slots outside the table or on a hole (-1) are skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..model.kv_format import ScaledFP8
from .attention import LOG2E, _index, _latent_keys, _rope_keys
from .config import AttentionTile, block

SPARSE_TILE = AttentionTile(rows=1, heads=16, keys=32)


@triton.jit(do_not_specialize=["heads", "selected", "table_width", "s_bt", "s_in"])
def _sparse_kernel(
    Q, KV, BlockTable, RowReq, Slots, Out, Lse,
    scale_log2, heads, selected, table_width,
    s_qn, s_qh, s_kp, s_kt, s_bt, s_in, s_on, s_oh, s_ln, s_lh,
    PAGE_SIZE: tl.constexpr, V_DIM: tl.constexpr, ROPE_DIM: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_ROPE: tl.constexpr, HEADS: tl.constexpr, KEYS: tl.constexpr,
    PRECISION: tl.constexpr, SCALE_GROUPS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    head_ok = head < heads
    req = tl.load(RowReq + row).to(tl.int64)
    dv = tl.arange(0, BLOCK_V)
    dr = tl.arange(0, BLOCK_ROPE)
    q_base = Q + row * s_qn + head.to(tl.int64)[:, None] * s_qh
    q_lat = tl.load(q_base + dv[None, :], mask=head_ok[:, None] & (dv < V_DIM)[None, :], other=0.0)
    q_rope = tl.load(q_base + V_DIM + dr[None, :], mask=head_ok[:, None] & (dr < ROPE_DIM)[None, :], other=0.0)

    m_i = tl.full([HEADS], float("-inf"), tl.float32)
    l_i = tl.zeros([HEADS], tl.float32)
    acc = tl.zeros([HEADS, BLOCK_V], tl.float32)
    for k0 in range(0, selected, KEYS):
        j = k0 + tl.arange(0, KEYS)
        slot_key = tl.load(Slots + row * s_in + j, mask=j < selected, other=-1)
        slot = slot_key // PAGE_SIZE
        listed = (slot_key >= 0) & (slot < table_width)
        page = tl.load(BlockTable + req * s_bt + slot, mask=listed, other=-1)
        key_ok = listed & (page >= 0)
        offset = slot_key % PAGE_SIZE
        kv_base = KV + page.to(tl.int64)[:, None] * s_kp + offset.to(tl.int64)[:, None] * s_kt
        k_lat = _latent_keys(kv_base, dv, key_ok[:, None] & (dv < V_DIM)[None, :], V_DIM, SCALE_GROUPS,
                             Q.dtype.element_ty)
        k_rope = _rope_keys(kv_base, dr, key_ok[:, None] & (dr < ROPE_DIM)[None, :], V_DIM, SCALE_GROUPS,
                            Q.dtype.element_ty)
        s = tl.dot(q_lat, tl.trans(k_lat), input_precision=PRECISION)
        s += tl.dot(q_rope, tl.trans(k_rope), input_precision=PRECISION)
        s = tl.where(key_ok[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Heads that have seen nothing yet keep m = -inf; shift them by 0 so exp2 gives 0, not nan.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_lat.dtype), k_lat, input_precision=PRECISION)
        m_i = m_new

    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) / LOG2E, float("-inf"))
    out_base = Out + row * s_on + head.to(tl.int64)[:, None] * s_oh
    tl.store(out_base + dv[None, :], out.to(Out.dtype.element_ty), mask=head_ok[:, None] & (dv < V_DIM)[None, :])
    tl.store(Lse + row * s_ln + head.to(tl.int64) * s_lh, lse, mask=head_ok)


def _checked(q, kv_cache, slots, v_dim):
    """The scaled-fp8 group count of ``kv_cache`` (0: plain), after checking the shapes agree."""
    scaled = kv_cache.dtype == torch.uint8
    if q.dim() != 3 or kv_cache.dim() != 3 or (q.shape[2] != kv_cache.shape[2] and not scaled):
        raise ValueError(f"q [N, H, W] and kv_cache [pages, page_size, W] must share W "
                         f"(got {tuple(q.shape)} and {tuple(kv_cache.shape)})")
    if slots.dim() != 2 or slots.shape[0] != q.shape[0]:
        raise ValueError(f"slots must be [N, K] with N = {q.shape[0]} query rows (got {tuple(slots.shape)})")
    if not 0 < v_dim < q.shape[2]:
        raise ValueError(f"v_dim must be in (0, {q.shape[2]}) (got {v_dim})")
    if kv_cache.stride(2) != 1:
        raise ValueError("kv_cache needs a unit channel stride")
    return ScaledFP8.of_width(kv_cache.shape[2], v_dim, q.shape[2] - v_dim).groups if scaled else 0


def sparse_attention(q, kv_cache, block_table, row_req, slots, scale, v_dim, *, tile: AttentionTile = SPARSE_TILE):
    """``(out [N, H, v_dim] in q's dtype, lse [N, H] float32)``: row ``i`` attends to the key slots
    ``slots[i]`` ([N, K] int, -1 pads) of request ``row_req[i]``'s pages in ``block_table``."""
    groups = _checked(q, kv_cache, slots, v_dim)
    if tile.rows != 1 or tile.value_split != 1:
        raise ValueError(f"sparse tile {tile.label()}: one row a program and no value split")
    block_table = _index(block_table, "block_table", 2)
    row_req, slots = _index(row_req, "row_req", 1), _index(slots, "slots", 2)
    q = q if q.stride(2) == 1 else q.contiguous()
    rows, heads, width = q.shape
    out = torch.empty(rows, heads, v_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)
    if rows == 0 or heads == 0:
        return out, lse
    grid = (rows, triton.cdiv(heads, tile.heads))
    _sparse_kernel[grid](
        q, kv_cache, block_table, row_req, slots, out, lse,
        float(scale) * 1.4426950408889634, heads, slots.shape[1], block_table.shape[1],
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
        slots.stride(0), out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        PAGE_SIZE=kv_cache.shape[1], V_DIM=v_dim, ROPE_DIM=width - v_dim,
        BLOCK_V=block(v_dim), BLOCK_ROPE=block(width - v_dim), HEADS=tile.heads, KEYS=tile.keys,
        PRECISION="ieee" if q.dtype == torch.float32 else None, SCALE_GROUPS=groups,
        num_warps=tile.warps, num_stages=tile.stages,
    )
    return out, lse
