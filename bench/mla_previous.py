"""The MLA attention kernel as committed in 8c08fbc (first H200 measurements), kept so the
sweep of bench/gpu_kernels.py times the previous kernel beside the current one in the same
run. Kernel and merge bodies are verbatim; only the config plumbing is reduced to a tile, the
processor count and the old split rule (2 programs per processor, at most 64 splits of at
least 256 keys). Not used outside the benchmark.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
_TABLE_CHUNK = 256


def _splits(processors: int, tile, rows: int, heads: int, max_keys: int) -> int:
    programs = rows * -(-heads // tile.heads)
    wanted = -(-processors * 2 // max(programs, 1))
    return max(1, min(wanted, max(1, max_keys // 256), 64))


def _block(dim: int) -> int:
    return max(16, triton.next_power_of_2(dim))


# Sizes that change from call to call are not specialised on (Triton would otherwise compile
# a variant whenever one of them happens to be 1 or a multiple of 16).
@triton.jit(do_not_specialize=["heads", "table_width", "num_splits"])
def _attention_kernel(
    Q, KV, BlockTable, PageIndex, RowReq, RowPos, Order, BlockStart, BlockLen, Out, Lse,
    scale_log2, heads, table_width, num_splits,
    s_qn, s_qh, s_kp, s_kt, s_bt, s_pi, s_on, s_oh, s_os, s_ln, s_lh, s_ls,
    PAGE_SIZE: tl.constexpr, V_DIM: tl.constexpr, ROPE_DIM: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_ROPE: tl.constexpr,
    ROWS: tl.constexpr, HEADS: tl.constexpr, KEYS: tl.constexpr, TABLE_CHUNK: tl.constexpr,
    ROW_BLOCKS: tl.constexpr, FINAL: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_s = tl.program_id(2)
    m = tl.arange(0, ROWS * HEADS)
    row_in_block = m // HEADS
    head = pid_h * HEADS + m % HEADS

    # Which query rows this program owns; all belong to one request.
    if ROW_BLOCKS:
        start = tl.load(BlockStart + pid_b)
        length = tl.load(BlockLen + pid_b)
        row_ok = row_in_block < length
        rows = tl.load(Order + start + row_in_block, mask=row_ok, other=0)
        first = tl.load(Order + start, mask=length > 0, other=0)
    else:
        length = tl.full([], 1, tl.int32)
        row_ok = row_in_block < 1
        rows = pid_b + row_in_block
        first = pid_b
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

    dv = tl.arange(0, BLOCK_V)
    dr = tl.arange(0, BLOCK_ROPE)
    q_base = Q + rows.to(tl.int64)[:, None] * s_qn + head.to(tl.int64)[:, None] * s_qh
    q_nope = tl.load(q_base + dv[None, :], mask=valid[:, None] & (dv < V_DIM)[None, :], other=0.0)
    q_rope = tl.load(q_base + V_DIM + dr[None, :], mask=valid[:, None] & (dr < ROPE_DIM)[None, :], other=0.0)

    m_i = tl.full([ROWS * HEADS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS * HEADS], tl.float32)
    acc = tl.zeros([ROWS * HEADS, BLOCK_V], tl.float32)
    for k0 in range(k_begin, k_end, KEYS):
        key = k0 + tl.arange(0, KEYS)
        in_range = key < k_end
        slot = key // PAGE_SIZE
        offset = key % PAGE_SIZE
        page = tl.load(BlockTable + req * s_bt + slot, mask=in_range, other=-1)
        index = tl.load(PageIndex + req * s_pi + slot, mask=in_range, other=0)
        key_pos = index * PAGE_SIZE + offset
        key_ok = in_range & (page >= 0)
        kv_base = KV + page.to(tl.int64)[:, None] * s_kp + offset.to(tl.int64)[:, None] * s_kt
        k_nope = tl.load(kv_base + dv[None, :], mask=key_ok[:, None] & (dv < V_DIM)[None, :], other=0.0)
        k_rope = tl.load(kv_base + V_DIM + dr[None, :], mask=key_ok[:, None] & (dr < ROPE_DIM)[None, :],
                         other=0.0)
        k_nope = k_nope.to(Q.dtype.element_ty)  # a narrower cache (fp8) computes in q's dtype
        k_rope = k_rope.to(Q.dtype.element_ty)
        s = tl.dot(q_nope, tl.trans(k_nope), input_precision=PRECISION)
        s += tl.dot(q_rope, tl.trans(k_rope), input_precision=PRECISION)
        visible = key_ok[None, :] & (key_pos[None, :] <= pos[:, None])
        s = tl.where(visible, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows that have seen nothing yet keep m = -inf; shift them by 0 so exp2 gives 0, not nan.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_nope.dtype), k_nope, input_precision=PRECISION)
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
    tl.store(out_base + dv[None, :], out.to(Out.dtype.element_ty), mask=valid[:, None] & (dv < V_DIM)[None, :])
    tl.store(lse_ptr, lse, mask=valid)


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


@triton.jit(do_not_specialize=["parts", "heads"])
def _merge_kernel(
    Outs, Lses, Out, Lse,
    parts, heads, dim,
    s_op, s_on, s_oh,  # strides of the partial outputs (channel stride 1)
    s_lp, s_ln, s_lh,  # strides of the partial lse
    s_n, s_h,  # strides of the merged output (channel stride 1)
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    n = (pid // heads).to(tl.int64)
    h = (pid % heads).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dmask = d < dim
    # First pass: the largest partial lse, so the weights below never overflow.
    top = tl.full([], float("-inf"), tl.float32)
    for p in range(parts):
        top = tl.maximum(top, tl.load(Lses + p * s_lp + n * s_ln + h * s_lh))
    # A row no part saw anything for stays (0, -inf); exp of (-inf - 0) is 0, not nan.
    safe = tl.where(top == float("-inf"), 0.0, top)
    total = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for p in range(parts):
        weight = tl.exp2((tl.load(Lses + p * s_lp + n * s_ln + h * s_lh) - safe) * LOG2E)
        part = tl.load(Outs + p * s_op + n * s_on + h * s_oh + d, mask=dmask, other=0.0).to(tl.float32)
        acc += weight * part
        total += weight
    out = tl.where(total > 0, acc / tl.where(total > 0, total, 1.0), 0.0)
    lse = tl.where(total > 0, safe + tl.log2(tl.where(total > 0, total, 1.0)) / LOG2E,
                   float("-inf"))
    tl.store(Out + n * s_n + h * s_h + d, out.to(Out.dtype.element_ty), mask=dmask)
    tl.store(Lse + n * heads + h, lse)


def _merge_into(outs, lses, out, lse) -> None:
    """Merge ``outs`` [P, N, H, D] (any strides with unit channel stride) weighted by
    ``lses`` [P, N, H] into ``out`` [N, H, D] and ``lse`` [N, H] float32 (contiguous)."""
    parts, rows, heads, dim = outs.shape
    if rows * heads == 0:
        return
    if outs.stride(3) != 1 or out.stride(2) != 1 or not lse.is_contiguous():
        raise ValueError("merge needs unit channel strides and a contiguous lse")
    _merge_kernel[(rows * heads,)](
        outs, lses, out, lse, parts, heads, dim,
        outs.stride(0), outs.stride(1), outs.stride(2),
        lses.stride(0), lses.stride(1), lses.stride(2),
        out.stride(0), out.stride(1),
        BLOCK_D=triton.next_power_of_2(dim), num_warps=4,
    )



def _index(t, name: str, dims: int):
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims (got shape {tuple(t.shape)})")
    return t.to(torch.int32).contiguous()


def paged_attention(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim, *,
                    processors: int, tile):
    """``(out [N, H, v_dim] in q's dtype, lse [N, H] float32)``, the MLAKernels contract."""
    if q.dim() != 3 or kv_cache.dim() != 3 or q.shape[2] != kv_cache.shape[2]:
        raise ValueError(f"q [N, H, W] and kv_cache [pages, page_size, W] must share W "
                         f"(got {tuple(q.shape)} and {tuple(kv_cache.shape)})")
    width = q.shape[2]
    if not 0 < v_dim < width:
        raise ValueError(f"v_dim must be in (0, {width}) (got {v_dim})")
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
    if rows == 0 or heads == 0 or table_width == 0:
        return (torch.zeros(rows, heads, v_dim, dtype=q.dtype, device=q.device),
                torch.full((rows, heads), float("-inf"), dtype=torch.float32, device=q.device))
    # Every (row, head) belongs to exactly one program, which always writes it.
    out = torch.empty(rows, heads, v_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)

    if tile.rows == 1:
        order = start = length = row_req  # unused by the kernel when ROW_BLOCKS is off
        programs = rows
    else:
        order, start, length, programs = _row_blocks(row_req, requests, tile.rows)
    splits = _splits(processors, tile, programs, heads, table_width * page_size)
    if splits == 1:
        part, part_lse = out, lse
        strides = (out.stride(0), out.stride(1), 0, lse.stride(0), lse.stride(1), 0)
    else:
        part = torch.empty(rows, heads, splits, v_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(rows, heads, splits, dtype=torch.float32, device=q.device)
        strides = (part.stride(0), part.stride(1), part.stride(2), *part_lse.stride())
    grid = (programs, triton.cdiv(heads, tile.heads), splits)
    _attention_kernel[grid](
        q, kv_cache, block_table, page_index, row_req, row_pos, order, start, length, part, part_lse,
        float(scale) * 1.4426950408889634, heads, table_width, splits,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        block_table.stride(0), page_index.stride(0), *strides,
        PAGE_SIZE=page_size, V_DIM=v_dim, ROPE_DIM=width - v_dim,
        BLOCK_V=_block(v_dim), BLOCK_ROPE=_block(width - v_dim),
        ROWS=tile.rows, HEADS=tile.heads, KEYS=tile.keys, TABLE_CHUNK=_TABLE_CHUNK,
        ROW_BLOCKS=tile.rows > 1, FINAL=splits == 1,
        PRECISION="ieee" if q.dtype == torch.float32 else None,
        num_warps=tile.warps, num_stages=tile.stages,
    )
    if splits > 1:
        _merge_into(part.permute(2, 0, 1, 3), part_lse.permute(2, 0, 1), out, lse)
    return out, lse


class PreviousKernels:
    """``decode`` / ``extend`` of the previous kernel with the given tiles (objects with rows,
    heads, keys, warps, stages) on ``processors`` processors."""

    def __init__(self, decode_tile, extend_tile, processors: int):
        self.decode = functools.partial(paged_attention, processors=processors, tile=decode_tile)
        self.extend = functools.partial(paged_attention, processors=processors, tile=extend_tile)
