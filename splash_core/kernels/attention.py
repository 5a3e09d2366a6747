"""Absorbed-MLA attention over the paged latent cache, in Triton (decode and extend).

One kernel serves both entry points of :class:`splash_core.platform.interfaces.MLAKernels`. A program
takes ``tile.rows`` query rows of one request times ``tile.heads`` heads (the M side of the
matrix multiplies: every head of a row reads the same latent keys, so a key tile loaded once
serves them all), ``1/tile.value_split`` of the value columns, and one of ``splits`` ranges of
that request's keys. The 576-wide key is never one dot: the latent part (also the value) and
the rotary part are power-of-two dots summed, and the latent tile loaded for the scores is
the one the values are read from. With one split the kernel writes the result; with more,
each split writes a float32 partial and its log-sum-exp and :mod:`.merge` combines them.
Float32 inputs get "ieee" dots (exact rather than tf32-rounded); 16-bit inputs get the
target's default, as any bf16 Triton kernel does.

Keys are found through the block table, so pages of any size, in any order and with holes
(-1) work. When a key tile lies inside one page (the page size is a multiple of the tile)
the kernel looks the page up with one scalar load: Triton's pipeliner then sees the key load
as direct and issues it ``stages - 1`` iterations ahead. Looked up per key (smaller pages),
the key load counts as indirect and runs at most one iteration ahead.

Integer offsets into the cache and the outputs are 64-bit: B = 64 requests of 128K tokens
hold more than 2**31 cache elements.

A uint8 cache holds the scaled-fp8 format (:mod:`splash_core.model.kv_format`): a key tile's
e4m3 latent codes are multiplied by their group's float32 scale and the bf16 rotary key read
as it is, both converted to the query's format right after the load, so the rest of the kernel
is the same for every format.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..model.kv_format import ScaledFP8
from .config import AttentionTile, MLAKernelConfig, block
from .merge import merge_into
from .tensor_memo import TensorMemo

LOG2E = tl.constexpr(1.4426950408889634)
_TABLE_CHUNK = 1024  # block-table entries scanned per step when sizing a request
_PLAN_CACHE = 4096  # call shapes whose (tile, splits) are kept


@triton.jit
def _scaled_latent(kv_base, cols, mask, V_DIM: tl.constexpr, GROUPS: tl.constexpr):
    """Latent channels ``cols`` of scaled-fp8 keys (byte pointers ``kv_base`` [keys, 1]) in float32."""
    codes = tl.load((kv_base + cols[None, :]).to(tl.pointer_type(tl.float8e4nv)), mask=mask, other=0.0).to(tl.float32)
    scale_base = (kv_base + V_DIM).to(tl.pointer_type(tl.float32))
    GROUP: tl.constexpr = V_DIM // GROUPS
    KEYS: tl.constexpr = codes.shape[0]
    WIDTH: tl.constexpr = codes.shape[1]
    if WIDTH % GROUP == 0:  # one scale per (key, group) loaded, not one per channel: 1/GROUP the bytes
        NG: tl.constexpr = WIDTH // GROUP
        group = tl.max(tl.reshape(cols // GROUP, (NG, GROUP)), axis=1)
        group_ok = tl.max(tl.reshape(mask.to(tl.int32), (KEYS, NG, GROUP)), axis=2) > 0
        scales = tl.load(scale_base + group[None, :], mask=group_ok, other=0.0)
        return tl.reshape(tl.reshape(codes, (KEYS, NG, GROUP)) * scales[:, :, None], (KEYS, WIDTH))
    else:
        return codes * tl.load(scale_base + (cols // GROUP)[None, :], mask=mask, other=0.0)


@triton.jit
def _latent_keys(kv_base, cols, mask, V_DIM: tl.constexpr, SCALE_GROUPS: tl.constexpr, dtype: tl.constexpr):
    if SCALE_GROUPS:
        keys = _scaled_latent(kv_base, cols, mask, V_DIM, SCALE_GROUPS).to(dtype)
    else:  # a narrower cache (fp8) computes in q's dtype
        keys = tl.load(kv_base + cols[None, :], mask=mask, other=0.0).to(dtype)
    return keys


@triton.jit
def _rope_keys(kv_base, dr, mask, V_DIM: tl.constexpr, SCALE_GROUPS: tl.constexpr, dtype: tl.constexpr):
    if SCALE_GROUPS:
        rope = (kv_base + V_DIM + 4 * SCALE_GROUPS).to(tl.pointer_type(tl.bfloat16))
        keys = tl.load(rope + dr[None, :], mask=mask, other=0.0).to(dtype)
    else:
        keys = tl.load(kv_base + V_DIM + dr[None, :], mask=mask, other=0.0).to(dtype)
    return keys


# Sizes that change from call to call (batch shape, table width, split count) are not
# specialised on: Triton would otherwise compile a variant whenever one of them happens to be
# 1 or a multiple of 16, in the middle of serving.
@triton.jit(do_not_specialize=["heads", "table_width", "num_splits", "row_programs", "s_bt", "s_pi",
                               "s_ln", "s_lh", "s_ls"])
def _attention_kernel(
    Q, KV, BlockTable, PageIndex, RowReq, RowPos, Order, BlockStart, BlockLen, Out, Lse,
    scale_log2, heads, table_width, num_splits, row_programs,
    s_qn, s_qh, s_kp, s_kt, s_bt, s_pi, s_on, s_oh, s_os, s_ln, s_lh, s_ls,
    PAGE_SIZE: tl.constexpr, V_DIM: tl.constexpr, ROPE_DIM: tl.constexpr,
    BLOCK_VP: tl.constexpr, BLOCK_ROPE: tl.constexpr,
    ROWS: tl.constexpr, HEADS: tl.constexpr, KEYS: tl.constexpr, VALUE_SPLIT: tl.constexpr,
    TABLE_CHUNK: tl.constexpr, ROW_BLOCKS: tl.constexpr, TILE_IN_PAGE: tl.constexpr,
    FINAL: tl.constexpr, PRECISION: tl.constexpr, SCALE_GROUPS: tl.constexpr,
):
    # Axis 0: row programs x head blocks x value parts, parts fastest, so the programs that
    # read the same keys run side by side and share them through the L2 cache.
    parts = tl.cdiv(heads, HEADS) * VALUE_SPLIT
    pid = tl.program_id(0)
    pid_row = pid // parts
    head_block = (pid % parts) // VALUE_SPLIT
    value_part = pid % VALUE_SPLIT
    pid_s = tl.program_id(1)
    m = tl.arange(0, ROWS * HEADS)
    row_in_block = m // HEADS
    head = head_block * HEADS + m % HEADS

    # Which query rows this program owns; all belong to one request. Row blocks run in
    # reverse: in a prefill chunk the last rows see the most keys, so they start first.
    if ROW_BLOCKS:
        row_block = row_programs - 1 - pid_row
        start = tl.load(BlockStart + row_block)
        length = tl.load(BlockLen + row_block)
        row_ok = row_in_block < length
        rows = tl.load(Order + start + row_in_block, mask=row_ok, other=0)
        first = tl.load(Order + start, mask=length > 0, other=0)
    else:
        length = tl.full([], 1, tl.int32)
        row_ok = row_in_block < 1
        rows = pid_row + row_in_block
        first = pid_row
    req = tl.load(RowReq + first).to(tl.int64)
    valid = row_ok & (head < heads)
    pos = tl.load(RowPos + rows, mask=valid, other=-1)  # -1: sees no key
    max_pos = tl.max(pos, 0)

    # Table slots that can hold a visible key: up to the last listed page that starts at or
    # before the block's last position (pages listed in order make this exact for causal rows).
    last = tl.full([], 0, tl.int32)
    for p0 in range(0, table_width, TABLE_CHUNK):
        slot = p0 + tl.arange(0, TABLE_CHUNK)
        listed = slot < table_width
        page = tl.load(BlockTable + req * s_bt + slot, mask=listed, other=-1)
        index = tl.load(PageIndex + req * s_pi + slot, mask=listed, other=0)
        useful = (page >= 0) & (index * PAGE_SIZE <= max_pos)
        last = tl.maximum(last, tl.max(tl.where(useful, slot + 1, 0), 0))
    total = tl.where(length > 0, last * PAGE_SIZE, 0)
    per_split = tl.cdiv(tl.cdiv(total, num_splits), KEYS) * KEYS
    k_begin = pid_s * per_split
    k_end = tl.minimum(k_begin + per_split, total)

    # This program's value columns come first (also the first part of the scores); with two
    # value parts the other half only adds to the scores.
    dv = tl.arange(0, BLOCK_VP)
    own = value_part * BLOCK_VP + dv
    other = (1 - value_part) * BLOCK_VP + dv
    dr = tl.arange(0, BLOCK_ROPE)
    q_base = Q + rows.to(tl.int64)[:, None] * s_qn + head.to(tl.int64)[:, None] * s_qh
    q_own = tl.load(q_base + own[None, :], mask=valid[:, None] & (own < V_DIM)[None, :], other=0.0)
    if VALUE_SPLIT == 2:
        q_other = tl.load(q_base + other[None, :], mask=valid[:, None] & (other < V_DIM)[None, :], other=0.0)
    q_rope = tl.load(q_base + V_DIM + dr[None, :], mask=valid[:, None] & (dr < ROPE_DIM)[None, :], other=0.0)

    m_i = tl.full([ROWS * HEADS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS * HEADS], tl.float32)
    acc = tl.zeros([ROWS * HEADS, BLOCK_VP], tl.float32)
    for k0 in range(k_begin, k_end, KEYS):
        if TILE_IN_PAGE:  # one scalar lookup; the range never ends inside a tile
            slot = k0 // PAGE_SIZE
            page = tl.load(BlockTable + req * s_bt + slot)
            offset = k0 % PAGE_SIZE + tl.arange(0, KEYS)
            key_pos = tl.load(PageIndex + req * s_pi + slot) * PAGE_SIZE + offset
            key_ok = (page >= 0) & (offset >= 0)  # the page's validity as a vector, like the masks below
            kv_base = KV + page.to(tl.int64) * s_kp + offset.to(tl.int64)[:, None] * s_kt
        else:
            key = k0 + tl.arange(0, KEYS)
            in_range = key < k_end
            slot = key // PAGE_SIZE
            offset = key % PAGE_SIZE
            page = tl.load(BlockTable + req * s_bt + slot, mask=in_range, other=-1)
            key_pos = tl.load(PageIndex + req * s_pi + slot, mask=in_range, other=0) * PAGE_SIZE + offset
            key_ok = in_range & (page >= 0)
            kv_base = KV + page.to(tl.int64)[:, None] * s_kp + offset.to(tl.int64)[:, None] * s_kt
        k_own = _latent_keys(kv_base, own, key_ok[:, None] & (own < V_DIM)[None, :], V_DIM, SCALE_GROUPS,
                             Q.dtype.element_ty)
        k_rope = _rope_keys(kv_base, dr, key_ok[:, None] & (dr < ROPE_DIM)[None, :], V_DIM, SCALE_GROUPS,
                            Q.dtype.element_ty)
        s = tl.dot(q_own, tl.trans(k_own), input_precision=PRECISION)
        if VALUE_SPLIT == 2:
            k_other = _latent_keys(kv_base, other, key_ok[:, None] & (other < V_DIM)[None, :], V_DIM, SCALE_GROUPS,
                                   Q.dtype.element_ty)
            s += tl.dot(q_other, tl.trans(k_other), input_precision=PRECISION)
        s += tl.dot(q_rope, tl.trans(k_rope), input_precision=PRECISION)
        visible = key_ok[None, :] & (key_pos[None, :] <= pos[:, None])
        s = tl.where(visible, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows that have seen nothing yet keep m = -inf; shift them by 0 so exp2 gives 0, not nan.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_own.dtype), k_own, input_precision=PRECISION)
        m_i = m_new

    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) / LOG2E, float("-inf"))
    out_base = Out + rows.to(tl.int64)[:, None] * s_on + head.to(tl.int64)[:, None] * s_oh
    lse_ptr = Lse + rows.to(tl.int64) * s_ln + head.to(tl.int64) * s_lh
    if not FINAL:
        out_base += pid_s * s_os
        lse_ptr += pid_s * s_ls
    tl.store(out_base + own[None, :], out.to(Out.dtype.element_ty), mask=valid[:, None] & (own < V_DIM)[None, :])
    tl.store(lse_ptr, lse, mask=valid & (value_part == 0))  # every value part computed the same lse


def _row_blocks(row_req, requests: int, rows_per_block: int):
    """Group query rows into blocks of at most ``rows_per_block`` rows of one request, on the
    device and without a host sync: (order, block_start, block_len, capacity). Blocks past
    the real count have length 0."""
    n = row_req.numel()
    order = torch.argsort(row_req, stable=True)
    ordered = row_req[order]
    idx = torch.arange(n, device=row_req.device)
    new_run = torch.ones(n, dtype=torch.bool, device=row_req.device)
    new_run[1:] = ordered[1:] != ordered[:-1]
    run_start = torch.cummax(torch.where(new_run, idx, 0), 0).values
    block_id = torch.cumsum(((idx - run_start) % rows_per_block == 0).long(), 0) - 1
    # Each request's run adds at most one partial block.
    capacity = min(n, -(-n // rows_per_block) + min(requests, n))
    start = torch.full((capacity,), n, dtype=torch.long, device=row_req.device)
    start.scatter_reduce_(0, block_id, idx, reduce="amin")
    length = torch.zeros(capacity, dtype=torch.long, device=row_req.device)
    length.scatter_add_(0, block_id, torch.ones_like(idx))
    return order.to(torch.int32), start.to(torch.int32), length.to(torch.int32), capacity


# every layer of a step passes the same row_req: its grouping (a dozen small device operations) is made once
_ROW_BLOCKS = TensorMemo()


def _index(t, name: str, dims: int):
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims (got shape {tuple(t.shape)})")
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def plan(config: MLAKernelConfig, entry: str, plans: dict, rows: int, heads: int, requests: int,
         table_width: int, page_size: int, v_dim: int, width: int, elem_bytes: int) -> tuple[AttentionTile, int]:
    """(tile, splits) of ``entry`` for a call of these sizes, checked against the device once
    and kept in ``plans`` (one dict per entry point), so a call costs a dictionary lookup."""
    key = (rows, heads, requests, table_width, page_size, v_dim, width, elem_bytes)
    found = plans.get(key)
    if found is not None:
        return found
    config.validate(v_dim, width - v_dim, elem_bytes)
    tile = config.tile(entry, heads)
    if block(v_dim) // tile.value_split < 16:
        raise ValueError(f"tile {tile.label()}: value_split {tile.value_split} leaves fewer than 16 "
                         f"value columns a program for v_dim={v_dim}")
    row_programs = rows if tile.rows == 1 else min(rows, -(-rows // tile.rows) + min(requests, rows))
    programs = row_programs * -(-heads // tile.heads) * tile.value_split
    partial_bytes = tile.m * (block(v_dim) // tile.value_split) * 4 * 2  # written, then read back
    splits = config.splits(tile, programs, table_width * page_size,
                           partial_bytes / (tile.keys * width * elem_bytes))
    if len(plans) >= _PLAN_CACHE:  # serving shapes recur; a stray sweep must not grow it forever
        plans.clear()
    plans[key] = (tile, splits)
    return tile, splits


def paged_attention(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim, *,
                    config: MLAKernelConfig, entry: str, plans: dict):
    """``(out [N, H, v_dim] in q's dtype, lse [N, H] float32)``, the MLAKernels contract, with
    the tile ``config`` gives ``entry`` ("decode" or "extend") for this head count."""
    scaled = kv_cache.dtype == torch.uint8
    if q.dim() != 3 or kv_cache.dim() != 3 or (q.shape[2] != kv_cache.shape[2] and not scaled):
        raise ValueError(f"q [N, H, W] and kv_cache [pages, page_size, W] must share W "
                         f"(got {tuple(q.shape)} and {tuple(kv_cache.shape)})")
    width = q.shape[2]
    if not 0 < v_dim < width:
        raise ValueError(f"v_dim must be in (0, {width}) (got {v_dim})")
    groups = ScaledFP8.of_width(kv_cache.shape[2], v_dim, width - v_dim).groups if scaled else 0
    if kv_cache.stride(2) != 1:
        raise ValueError("kv_cache needs a unit channel stride")
    block_table = _index(block_table, "block_table", 2)
    page_index = _index(page_index, "page_index", 2)
    row_req = _index(row_req, "row_req", 1)
    row_pos = _index(row_pos, "row_pos", 1)
    q = q if q.stride(2) == 1 else q.contiguous()
    rows, heads, _ = q.shape
    requests, table_width = block_table.shape
    page_size = kv_cache.shape[1]
    tile, splits = plan(config, entry, plans, rows, heads, requests, table_width, page_size, v_dim, width,
                        q.element_size())
    if rows == 0 or heads == 0 or table_width == 0:
        return (torch.zeros(rows, heads, v_dim, dtype=q.dtype, device=q.device),
                torch.full((rows, heads), float("-inf"), dtype=torch.float32, device=q.device))
    # Every (row, head, value column) belongs to exactly one program, which always writes it.
    out = torch.empty(rows, heads, v_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)
    if tile.rows == 1:
        order = start = length = row_req  # unused by the kernel when ROW_BLOCKS is off
        row_programs = rows
    else:
        order, start, length, row_programs = _ROW_BLOCKS.get(
            (row_req,), (requests, tile.rows), lambda: _row_blocks(row_req, requests, tile.rows))
    if splits == 1:
        part, part_lse = out, lse
        strides = (out.stride(0), out.stride(1), 0, lse.stride(0), lse.stride(1), 0)
    else:
        part = torch.empty(rows, heads, splits, v_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(rows, heads, splits, dtype=torch.float32, device=q.device)
        strides = (part.stride(0), part.stride(1), part.stride(2), *part_lse.stride())
    grid = (row_programs * triton.cdiv(heads, tile.heads) * tile.value_split, splits)
    _attention_kernel[grid](
        q, kv_cache, block_table, page_index, row_req, row_pos, order, start, length, part, part_lse,
        float(scale) * 1.4426950408889634, heads, table_width, splits, row_programs,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        block_table.stride(0), page_index.stride(0), *strides,
        PAGE_SIZE=page_size, V_DIM=v_dim, ROPE_DIM=width - v_dim,
        BLOCK_VP=block(v_dim) // tile.value_split, BLOCK_ROPE=block(width - v_dim),
        ROWS=tile.rows, HEADS=tile.heads, KEYS=tile.keys, VALUE_SPLIT=tile.value_split,
        TABLE_CHUNK=_TABLE_CHUNK, ROW_BLOCKS=tile.rows > 1, TILE_IN_PAGE=page_size % tile.keys == 0,
        FINAL=splits == 1, PRECISION="ieee" if q.dtype == torch.float32 else None, SCALE_GROUPS=groups,
        num_warps=tile.warps, num_stages=tile.stages, **dict(config.launch_options),
    )
    if splits > 1:
        merge_into(part.permute(2, 0, 1, 3), part_lse.permute(2, 0, 1), out, lse)
    return out, lse
