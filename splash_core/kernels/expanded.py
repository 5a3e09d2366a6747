"""Expanded (MHA-form) MLA attention over packed keys, in Triton, for chunked prefill.

Where the absorbed kernel (:mod:`.attention`) attends with 576-wide latent keys, this one takes
keys already expanded through kv_b: per head a d_n-wide k_nope and a d_v-wide value, plus the
rotary key every head shares. Per (query, key, head) that is 2·(d_n + d_r + d_v) FLOPs instead
of 2·(d_c + d_r + d_c): 3.4x less at DeepSeek-V3 widths, which is why engines run long prefill
chunks in this form.

Contract (:func:`splash_core.reference.expanded.expanded_attention` is its executable spec):

- ``q`` [N, H, d_n + d_r]: per query row and head, q_nope (first d_n channels) ++ rotated q_rope.
- ``k_nope`` [M, H, d_n], ``v`` [M, H, d_v]: per key and head, the expanded key and value;
  ``k_rope`` [M, d_r]: the rotated rotary key, shared by all heads (never broadcast in memory).
  Every last dim has unit stride; other strides are free, so ``k_nope`` and ``v`` may be views
  of one [M, H, d_n + d_v] tensor.
- The keys of request r are rows ``k_start[r] .. k_start[r+1]-1`` (``k_start`` [R+1],
  nondecreasing, ``k_start[R] <= M``); ``k_pos`` [M] their absolute positions (>= 0).
- ``q_req`` [N]: each row's request (0 <= r < R); ``q_pos`` [N]: its absolute position. Row i
  attends to the keys of request ``q_req[i]`` with ``k_pos <= q_pos[i]``. Rows of one request
  may come in any order, interleaved with other requests' rows.
- ``scale``: the softmax scale. Returns ``(out [N, H, d_v] in q's dtype, lse [N, H] float32)``,
  lse the natural-log log-sum-exp of the scaled visible scores; a row that sees no key gets
  out 0 and lse -inf.
- Index tensors are int32 (others are converted); positions and counts stay below 2**31.

A program takes ``tile.block_m`` rows of one request and ONE head (grid: row blocks x heads),
so the scores are one [block_m, d_n] x [d_n, block_n] dot plus a [block_m, d_r] x [d_r,
block_n] one, and the values a [block_m, block_n] x [block_n, d_v] dot. Row blocks are formed
on the device (:func:`.attention._row_blocks`, no host sync) and run longest first. Programs
of neighbouring row blocks of one head run side by side, so they share that head's key tiles
(and every head the rotary tile) through the L2 cache.

Skipping invisible keys, masking only where needed: before the launch, device-side torch ops
find for every row block two bounds in its request's keys (a prefix maximum and a suffix
minimum of ``k_pos``, then binary searches): ``full_end``, before which every key is seen by
every row of the block, and ``end``, the shortest prefix holding every key any of its rows
sees. The kernel runs the whole tiles before ``full_end`` without masks, then the rest up to
``end`` masked by position, so both bounds are exact for keys in any order; for keys in
position order (as serving gives them) the loop stops right after the block's last visible
key, and only the tiles on the causal diagonal pay for masks.

Float32 inputs get "ieee" dots (exact); 16-bit inputs the target's default precision. Offsets
into the key, value and output tensors are 64-bit: M·H·d passes 2**31 at 64K keys of 128 heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention import _index, _row_blocks
from .config import ExpandedTile, block
from .tensor_memo import TensorMemo

LOG2E = tl.constexpr(1.4426950408889634)
_REQUEST_SHIFT = 32  # positions < 2**31, so request * 2**32 + position orders by request first


@triton.jit
def _key_tile(acc, l_i, m_i, q_nope, q_rope, pos, KNope, KRope, V, KPos, k0, k_end, head,
              s_kn, s_kh, s_rn, s_vn, s_vh, scale_log2, dn, dr, dv,
              D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, D_V: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr, MASKED: tl.constexpr):
    """One online-softmax step over keys ``k0 .. k0 + BLOCK_N - 1``; unmasked (``MASKED`` off)
    only for a whole tile that every row sees."""
    key = k0 + tl.arange(0, BLOCK_N)
    key_ok = key < k_end
    key64 = key.to(tl.int64)
    if MASKED:
        nope_mask = key_ok[:, None] & (dn < D_NOPE)[None, :]
        rope_mask = key_ok[:, None] & (dr < D_ROPE)[None, :]
        value_mask = key_ok[:, None] & (dv < D_V)[None, :]
    else:  # the channel masks alone fold away at power-of-two widths
        nope_mask = (dn < D_NOPE)[None, :]
        rope_mask = (dr < D_ROPE)[None, :]
        value_mask = (dv < D_V)[None, :]
    k_nope = tl.load(KNope + key64[:, None] * s_kn + head * s_kh + dn[None, :], mask=nope_mask, other=0.0)
    k_rope = tl.load(KRope + key64[:, None] * s_rn + dr[None, :], mask=rope_mask, other=0.0)
    s = tl.dot(q_nope, tl.trans(k_nope), input_precision=PRECISION)
    s += tl.dot(q_rope, tl.trans(k_rope), input_precision=PRECISION)
    if MASKED:
        key_pos = tl.load(KPos + key, mask=key_ok, other=0)
        visible = key_ok[None, :] & (key_pos[None, :] <= pos[:, None])
        s = tl.where(visible, s * scale_log2, float("-inf"))
    else:
        s = s * scale_log2
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # Rows that have seen nothing yet keep m = -inf; shift them by 0 so exp2 gives 0, not nan.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    values = tl.load(V + key64[:, None] * s_vn + head * s_vh + dv[None, :], mask=value_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=PRECISION)
    return acc, l_i, m_new


# Sizes and strides change from call to call; specialising on them (value 1, multiples of 16)
# would compile new variants in the middle of serving.
@triton.jit(do_not_specialize=["row_programs", "s_qn", "s_qh", "s_kn", "s_kh", "s_rn", "s_vn", "s_vh",
                               "s_on", "s_oh", "s_ln", "s_lh"])
def _expanded_kernel(
    Q, KNope, KRope, V, QReq, QPos, KStart, KPos, Order, BlockStart, BlockLen, FullEnd, KeyEnd, Out, Lse,
    scale_log2, row_programs,
    s_qn, s_qh, s_kn, s_kh, s_rn, s_vn, s_vh, s_on, s_oh, s_ln, s_lh,
    D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, D_V: tl.constexpr,
    BLOCK_DN: tl.constexpr, BLOCK_DR: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    # Longest blocks first: in a prefill chunk the last rows see the most keys.
    row_block = row_programs - 1 - tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    start = tl.load(BlockStart + row_block)
    length = tl.load(BlockLen + row_block)
    i = tl.arange(0, BLOCK_M)
    row_ok = i < length
    rows = tl.load(Order + start + i, mask=row_ok, other=0).to(tl.int64)
    first = tl.load(Order + start, mask=length > 0, other=0)
    req = tl.load(QReq + first)
    k_begin = tl.load(KStart + req)
    k_full = tl.load(FullEnd + row_block)  # keys before it: seen by every row of the block
    k_end = tl.load(KeyEnd + row_block)  # 0 for blocks past the real count: no iteration
    pos = tl.load(QPos + rows, mask=row_ok, other=-1)  # -1: sees no key

    dn = tl.arange(0, BLOCK_DN)
    dr = tl.arange(0, BLOCK_DR)
    dv = tl.arange(0, BLOCK_DV)
    q_base = Q + rows[:, None] * s_qn + head * s_qh
    q_nope = tl.load(q_base + dn[None, :], mask=row_ok[:, None] & (dn < D_NOPE)[None, :], other=0.0)
    q_rope = tl.load(q_base + D_NOPE + dr[None, :], mask=row_ok[:, None] & (dr < D_ROPE)[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    # Whole tiles every row of the block sees run without masks; the rest mask by position.
    unmasked_end = k_begin + tl.maximum(k_full - k_begin, 0) // BLOCK_N * BLOCK_N
    for k0 in range(k_begin, unmasked_end, BLOCK_N):
        acc, l_i, m_i = _key_tile(acc, l_i, m_i, q_nope, q_rope, pos, KNope, KRope, V, KPos, k0, k_end, head,
                                  s_kn, s_kh, s_rn, s_vn, s_vh, scale_log2, dn, dr, dv, D_NOPE, D_ROPE, D_V,
                                  BLOCK_N, PRECISION, False)
    for k0 in range(unmasked_end, k_end, BLOCK_N):
        acc, l_i, m_i = _key_tile(acc, l_i, m_i, q_nope, q_rope, pos, KNope, KRope, V, KPos, k0, k_end, head,
                                  s_kn, s_kh, s_rn, s_vn, s_vh, scale_log2, dn, dr, dv, D_NOPE, D_ROPE, D_V,
                                  BLOCK_N, PRECISION, True)

    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) / LOG2E, float("-inf"))
    tl.store(Out + rows[:, None] * s_on + head * s_oh + dv[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None] & (dv < D_V)[None, :])
    tl.store(Lse + rows * s_ln + head * s_lh, lse, mask=row_ok)


def key_bounds(q_req, q_pos, k_start, k_pos, order, block_start, block_len):
    """Per row block (as :func:`.attention._row_blocks` forms them): ``(full_end, end)``, where
    every key of its request before ``full_end`` is seen by every row of the block, and the
    keys before ``end`` include every key any of its rows sees (the shortest such prefix);
    both 0 for empty blocks. Device ops only, no host sync."""
    n, m = q_req.numel(), k_pos.numel()
    device = q_req.device
    key_req = torch.searchsorted(k_start, torch.arange(m, dtype=torch.int32, device=device), right=True) - 1
    keyed = (key_req.long() << _REQUEST_SHIFT) + k_pos.long()
    # Prefix maxima and suffix minima over the whole array stay inside each request: earlier
    # requests' keys are smaller, later ones larger.
    prefix_max = keyed.cummax(0).values
    suffix_min = keyed.flip(0).cummin(0).values.flip(0)
    # Each block's smallest and largest position (blocks own consecutive entries of ``order``).
    sorted_block = torch.searchsorted(block_start, torch.arange(n, dtype=torch.int32, device=device), right=True) - 1
    positions = q_pos[order.long()].long()
    lowest = torch.full((block_start.numel(),), 2**31 - 1, dtype=torch.long, device=device)
    lowest.scatter_reduce_(0, sorted_block, positions, reduce="amin")
    highest = torch.full((block_start.numel(),), -1, dtype=torch.long, device=device)
    highest.scatter_reduce_(0, sorted_block, positions, reduce="amax")
    request = q_req[order.long()[block_start.long().clamp(max=n - 1)]].long() << _REQUEST_SHIFT
    full_end = torch.searchsorted(prefix_max, request + lowest, right=True)
    end = torch.searchsorted(suffix_min, request + highest, right=True)
    real = block_len > 0
    return torch.where(real, full_end, 0).to(torch.int32), torch.where(real, end, 0).to(torch.int32)


def _launch_plan(q_req, q_pos, k_start, k_pos, block_m: int):
    order, start, length, capacity = _row_blocks(q_req, k_start.numel() - 1, block_m)
    full_end, end = key_bounds(q_req, q_pos, k_start, k_pos, order, start, length)
    return order, start, length, full_end, end, capacity


_PLANS = TensorMemo()  # the launch plan (row blocks and their key bounds), made once a step


def _unit_stride(t, name: str):
    if t.stride(-1) != 1:
        raise ValueError(f"{name} needs a unit stride in its last dim (got strides {tuple(t.stride())})")


def _check(q, k_nope, k_rope, v, q_req, q_pos, k_pos):
    if q.dim() != 3 or k_nope.dim() != 3 or v.dim() != 3 or k_rope.dim() != 2:
        raise ValueError(f"expected q [N, H, d_n + d_r], k_nope [M, H, d_n], k_rope [M, d_r], v [M, H, d_v] "
                         f"(got {tuple(q.shape)}, {tuple(k_nope.shape)}, {tuple(k_rope.shape)}, {tuple(v.shape)})")
    n, heads, width = q.shape
    m = k_nope.shape[0]
    if (k_nope.shape[1], v.shape[1]) != (heads, heads) or (k_rope.shape[0], v.shape[0]) != (m, m):
        raise ValueError(f"k_nope, v must be [M, {heads}, d] and k_rope [M, d_r] for one M "
                         f"(got {tuple(k_nope.shape)}, {tuple(v.shape)}, {tuple(k_rope.shape)})")
    if k_nope.shape[2] + k_rope.shape[1] != width:
        raise ValueError(f"q's width {width} must be d_n + d_r = {k_nope.shape[2]} + {k_rope.shape[1]}")
    if len({q.dtype, k_nope.dtype, k_rope.dtype, v.dtype}) != 1:
        raise ValueError(f"q, k_nope, k_rope, v must share a dtype (got {q.dtype}, {k_nope.dtype}, "
                         f"{k_rope.dtype}, {v.dtype})")
    if q_req.shape != (n,) or q_pos.shape != (n,) or k_pos.shape != (m,):
        raise ValueError(f"q_req, q_pos must be [{n}] and k_pos [{m}] (got {tuple(q_req.shape)}, "
                         f"{tuple(q_pos.shape)}, {tuple(k_pos.shape)})")
    for t, name in ((q, "q"), (k_nope, "k_nope"), (k_rope, "k_rope"), (v, "v")):
        _unit_stride(t, name)


def expanded_attention(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale, *, tile: ExpandedTile = ExpandedTile()):
    """The module's contract, computed by the Triton kernel with ``tile`` (fitted to the call)."""
    _check(q, k_nope, k_rope, v, q_req, q_pos, k_pos)
    if k_start.dim() != 1 or k_start.numel() < 1:
        raise ValueError(f"k_start must be [R + 1] (got shape {tuple(k_start.shape)})")
    n, heads, width = q.shape
    m, d_n, d_v = k_nope.shape[0], k_nope.shape[2], v.shape[2]
    if n == 0 or heads == 0 or m == 0:
        return (torch.zeros(n, heads, d_v, dtype=q.dtype, device=q.device),
                torch.full((n, heads), float("-inf"), dtype=torch.float32, device=q.device))
    q_req, q_pos = _index(q_req, "q_req", 1), _index(q_pos, "q_pos", 1)
    k_start, k_pos = _index(k_start, "k_start", 1), _index(k_pos, "k_pos", 1)
    tile = tile.fitted(n, m)
    order, start, length, full_end, end, row_programs = _PLANS.get(
        (q_req, q_pos, k_start, k_pos), tile.block_m, lambda: _launch_plan(q_req, q_pos, k_start, k_pos, tile.block_m))
    # Every row belongs to exactly one block, whose programs write all of its outputs.
    out = torch.empty(n, heads, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(n, heads, dtype=torch.float32, device=q.device)
    _expanded_kernel[(row_programs, heads)](
        q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, order, start, length, full_end, end, out, lse,
        float(scale) * 1.4426950408889634, row_programs,
        q.stride(0), q.stride(1), k_nope.stride(0), k_nope.stride(1), k_rope.stride(0),
        v.stride(0), v.stride(1), out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        D_NOPE=d_n, D_ROPE=width - d_n, D_V=d_v,
        BLOCK_DN=block(d_n), BLOCK_DR=block(width - d_n), BLOCK_DV=block(d_v),
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, PRECISION="ieee" if q.dtype == torch.float32 else None,
        num_warps=tile.warps, num_stages=tile.stages,
    )
    return out, lse
