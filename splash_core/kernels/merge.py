"""Log-sum-exp merge of partial attention results (CP's merge and decode's second stage).

A program merges one (row, head) over a block of the value columns: all parts' lse at
once (one vector load), then the weighted sum of the parts' columns as one 2-D tile, so
the loads of every part are in flight together. Narrow column blocks when there are many
parts keep the tile small and give a batch of one request enough programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# exp and log through exp2/log2, which every Triton target has as a fast instruction.
LOG2E = tl.constexpr(1.4426950408889634)
_TILE_ELEMENTS = 8192  # parts x columns one program holds (64 float32 registers a thread at 4 warps)
_MAX_PART_BLOCK = 64


@triton.jit(do_not_specialize=["parts", "heads"])
def _merge_kernel(
    Outs, Lses, Out, Lse,
    parts, heads, dim,
    s_op, s_on, s_oh,  # strides of the partial outputs (channel stride 1)
    s_lp, s_ln, s_lh,  # strides of the partial lse
    s_n, s_h,  # strides of the merged output (channel stride 1)
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    n = (pid // heads).to(tl.int64)
    h = (pid % heads).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < dim
    lse_base = Lses + n * s_ln + h * s_lh
    # First pass: the largest partial lse, so the weights below never overflow.
    top = tl.full([], float("-inf"), tl.float32)
    for p0 in range(0, parts, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        top = tl.maximum(top, tl.max(tl.load(lse_base + p * s_lp, mask=p < parts, other=float("-inf")), 0))
    # A row no part saw anything for stays (0, -inf); exp of (-inf - 0) is 0, not nan.
    safe = tl.where(top == float("-inf"), 0.0, top)
    total = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for p0 in range(0, parts, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        weight = tl.exp2((tl.load(lse_base + p * s_lp, mask=p < parts, other=float("-inf")) - safe) * LOG2E)
        # Parts that saw no key (weight 0) are not read at all.
        tile = tl.load(Outs + p[:, None] * s_op + n * s_on + h * s_oh + d[None, :],
                       mask=(weight > 0)[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(weight[:, None] * tile, 0)
        total += tl.sum(weight, 0)
    out = tl.where(total > 0, acc / tl.where(total > 0, total, 1.0), 0.0)
    tl.store(Out + n * s_n + h * s_h + d, out.to(Out.dtype.element_ty), mask=dmask)
    if tl.program_id(1) == 0:
        lse = tl.where(total > 0, safe + tl.log2(tl.where(total > 0, total, 1.0)) / LOG2E, float("-inf"))
        tl.store(Lse + n * heads + h, lse)


def merge_into(outs, lses, out, lse) -> None:
    """Merge ``outs`` [P, N, H, D] (any strides with unit channel stride) weighted by
    ``lses`` [P, N, H] into ``out`` [N, H, D] and ``lse`` [N, H] float32 (contiguous)."""
    parts, rows, heads, dim = outs.shape
    if rows * heads == 0:
        return
    if outs.stride(3) != 1 or out.stride(2) != 1 or not lse.is_contiguous():
        raise ValueError("merge needs unit channel strides and a contiguous lse")
    block_p = min(triton.next_power_of_2(max(parts, 1)), _MAX_PART_BLOCK)
    block_d = min(triton.next_power_of_2(dim), max(16, _TILE_ELEMENTS // block_p))
    _merge_kernel[(rows * heads, triton.cdiv(dim, block_d))](
        outs, lses, out, lse, parts, heads, dim,
        outs.stride(0), outs.stride(1), outs.stride(2),
        lses.stride(0), lses.stride(1), lses.stride(2),
        out.stride(0), out.stride(1),
        BLOCK_P=block_p, BLOCK_D=block_d, num_warps=4,
    )


def merge(outs, lses):
    """:attr:`MLAKernels.merge`: (out [N, H, D] in outs' dtype, lse [N, H] float32)."""
    if outs.dim() != 4 or lses.shape != outs.shape[:3]:
        raise ValueError(f"merge expects outs [P, N, H, D] and lses [P, N, H] "
                         f"(got {tuple(outs.shape)} and {tuple(lses.shape)})")
    outs = outs if outs.stride(3) == 1 else outs.contiguous()
    _, rows, heads, dim = outs.shape
    out = torch.empty(rows, heads, dim, dtype=outs.dtype, device=outs.device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=outs.device)
    merge_into(outs, lses.float(), out, lse)
    return out, lse
