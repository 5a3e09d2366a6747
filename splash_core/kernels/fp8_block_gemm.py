"""``y = x W^T`` with FP8 operands in Triton: activations in 1 x 128 token groups, the weight in
128 x 128 blocks (:mod:`splash_core.model.fp8_blocks`, whose dequantize-then-matmul is the spec).

One program computes a BLOCK_M x BLOCK_N tile of ``y`` and walks the weight's column blocks: in
each, the e4m3 codes meet in one dot product (FP8 tensor cores where the device has them, float32
accumulation) and the partial sum is scaled by its token-group and weight-block scales. A weight
slice that starts inside a block walks the same blocks as the whole weight, its first and last
partial (masked loads); rows read their block's scale row by row, so row starts and edges need
nothing more. The grouped form runs every expert's rows (sorted by expert, ``offsets`` [E + 1])
against that expert's weight in one launch; the plain form is its one-expert case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from ..model import fp8_blocks
from ..model.fp8_blocks import BLOCK, BlockScaledFP8, TokenGroupsFP8, blocks_touched
from ..platform.interfaces import FP8LinearKernels
from .fp8_cache import _e4m3_codes

_E4M3_MAX: tl.constexpr = tl.constexpr(fp8_blocks.E4M3_MAX)
_TINY_SCALE: tl.constexpr = tl.constexpr(fp8_blocks.TINY_SCALE)


@dataclass(frozen=True)
class GemmTile:
    """Tile and launch settings of the kernel (``block_m`` >= 16, ``block_n`` >= 16, powers of two).
    ``split_k`` > 1 shares each tile's column blocks among that many programs, whose float32 partial
    sums are added afterwards: decode-sized batches against narrow weights otherwise start too few
    programs to stream the weight at the memory's speed. ``swap`` computes each tile transposed, the
    weight's ``block_n`` rows as the matrix instruction's rows and the batch's ``block_m`` as its
    columns: a Hopper warpgroup MMA has at least 64 rows, which a batch of 16 would mostly pad."""

    block_m: int = 64
    block_n: int = 128
    warps: int = 4
    stages: int = 3
    split_k: int = 1
    swap: bool = False  # y^T = W x^T: the weight's rows on the MMA's long side, the batch on its short one


PROGRAMS = 256  # programs a split launch aims for: about two per compute unit of a large device


def portable_tile(rows: int, n: int, k: int) -> GemmTile:
    """A tile for ``rows`` activation rows times a weight [n, k] on any device: narrow and deeply
    pipelined for decode-sized batches (they stream the weight); a launch of under a quarter of
    :data:`PROGRAMS` programs splits its column blocks to reach about that many (adding the partial
    sums costs more than it gains above). Chosen from bench/fp8_gemm.py's candidates on an H100."""
    if rows <= 16:
        block_m, block_n, warps, stages = 16, 32, 4, 5
    elif rows <= 64:
        block_m, block_n, warps, stages = 64, 64, 4, 5
    else:
        block_m, block_n, warps, stages = 64, 128, 4, 3
    programs = max(1, triton.cdiv(rows, block_m) * triton.cdiv(n, block_n))
    if programs >= PROGRAMS // 4:
        return GemmTile(block_m, block_n, warps, stages)
    split = max(1, min(PROGRAMS // programs, k // (8 * 128)))  # at least 8 column blocks a split
    return GemmTile(block_m, block_n, warps, stages, split)


# The row count changes every step: specialized (on divisibility by 16) it would compile another
# kernel the first time a step's rows fall the other way, a second's stall in the middle of serving.
@triton.jit(do_not_specialize=["M", "s_ys"])
def _fp8_block_gemm_kernel(X, XS, W, WS, Y, Offsets, M, N, K, KB, SPLITS, R0, C0, s_xm, s_xsm, s_we, s_wn, s_wse,
                           s_wsn, s_ym, s_ys, ROW_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, GROUPED: tl.constexpr, SWAP: tl.constexpr):
    expert = tl.program_id(2) // SPLITS
    split = tl.program_id(2) % SPLITS
    per_split = tl.cdiv(KB, SPLITS)
    first = tl.program_id(0) * BLOCK_M
    end = M
    if GROUPED:  # this expert's rows
        first += tl.load(Offsets + expert)
        end = tl.load(Offsets + expert + 1)
    if first < end:
        m = first + tl.arange(0, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok, n_ok = m < end, n < N
        w_rows = W + expert.to(tl.int64) * s_we + n[:, None].to(tl.int64) * s_wn
        w_scales = WS + expert.to(tl.int64) * s_wse + ((R0 + n) // ROW_BLOCK) * s_wsn
        x_rows = X + m[:, None].to(tl.int64) * s_xm
        acc = tl.zeros([BLOCK_N, BLOCK_M] if SWAP else [BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in range(split * per_split, tl.minimum(KB, (split + 1) * per_split)):
            k = kb * BLOCK_K - C0 + tl.arange(0, BLOCK_K)  # this column block's channels (partial at the edges)
            if EVEN_K:
                a = tl.load(x_rows + k[None, :], mask=m_ok[:, None], other=0.0)
                b = tl.load(w_rows + k[None, :], mask=n_ok[:, None], other=0.0)
            else:
                k_ok = (k >= 0) & (k < K)
                a = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x_scale = tl.load(XS + m * s_xsm + kb, mask=m_ok, other=0.0)
            w_scale = tl.load(w_scales + kb, mask=n_ok, other=0.0)
            if SWAP:
                acc += tl.dot(b, tl.trans(a)) * w_scale[:, None] * x_scale[None, :]
            else:
                acc += tl.dot(a, tl.trans(b)) * x_scale[:, None] * w_scale[None, :]
        y = Y + split.to(tl.int64) * s_ys  # this split's sums
        if SWAP:
            tl.store(y + m[None, :].to(tl.int64) * s_ym + n[:, None], acc.to(Y.dtype.element_ty),
                     mask=n_ok[:, None] & m_ok[None, :])
        else:
            tl.store(y + m[:, None].to(tl.int64) * s_ym + n[None, :], acc.to(Y.dtype.element_ty),
                     mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _token_groups_kernel(X, Codes, Scales, K, START, s_xm, s_cm, s_sm, GROUP: tl.constexpr, GROUPS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)  # this program's groups
    c = g[:, None] * GROUP - START + tl.arange(0, GROUP)[None, :]
    ok = (c >= 0) & (c < K)
    x = tl.load(X + row * s_xm + c, mask=ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), 1)
    # A NaN must reach the output (max may skip it): its group's scale becomes NaN. Divisions
    # round as torch's do, so the codes equal the reference's bit for bit.
    nan = tl.max((x != x).to(tl.int32), 1) > 0
    scale = tl.where(nan, float("nan"), tl.maximum(tl.math.div_rn(amax, _E4M3_MAX), _TINY_SCALE))
    y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale[:, None]), -_E4M3_MAX), _E4M3_MAX)
    y = tl.where(y == y, y, 0.0)  # the NaN travels in the scale; codes come from numbers only
    tl.store(Codes + row * s_cm + c, _e4m3_codes(y).to(tl.uint8), mask=ok)
    tl.store(Scales + row * s_sm + g, scale, mask=g * GROUP - START < K)


def quantize_token_groups(x: torch.Tensor, start: int = 0, group: int = BLOCK) -> TokenGroupsFP8:
    """:func:`~splash_core.model.fp8_blocks.quantize_tokens` in Triton, bit for bit: ``x`` [m, k]
    in e4m3 per token and group of ``group`` channels, the first ``group - start`` wide."""
    from . import interpreter

    if interpreter.interpreting():
        interpreter.patch_scalar_index()
    m, k = x.shape
    groups = blocks_touched(start, k, group)
    codes = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    if m and k:
        x = x if x.stride(1) == 1 else x.contiguous()
        per = min(8, triton.next_power_of_2(groups))
        _token_groups_kernel[(m, triton.cdiv(groups, per))](x, codes.view(torch.uint8), scales, k, start, x.stride(0),
                                                            codes.stride(0), scales.stride(0), GROUP=group,
                                                            GROUPS=per)
    return TokenGroupsFP8(codes, scales, start, group)


def _check_operands(x: TokenGroupsFP8, w: BlockScaledFP8) -> None:
    k = w.codes.shape[-1]
    if x.codes.shape[1] != k or x.start != w.start[1] or x.group != w.block[1]:
        raise ValueError(f"activations [{x.codes.shape[1]} channels from {x.start} in groups of {x.group}] do not "
                         f"match the weight's columns [{k} from {w.start[1]} in blocks of {w.block[1]}]")
    if x.codes.stride(1) != 1 or w.codes.stride(-1) != 1:
        raise ValueError("FP8 GEMM operands need contiguous channels")


def grouped_fp8_block_gemm(x: TokenGroupsFP8, w: BlockScaledFP8, offsets: torch.Tensor,
                           out_dtype: torch.dtype = torch.bfloat16, tile: GemmTile | None = None,
                           max_rows: int | None = None) -> torch.Tensor:
    """Rows ``offsets[e]:offsets[e + 1]`` of ``x`` times expert ``e``'s weight of ``w`` (codes [E, n,
    k]), transposed: ``y`` [m, n] in ``out_dtype``. ``offsets`` [E + 1] on ``x``'s device, rising from 0
    to m (rows outside them are left unwritten). ``max_rows``, when the caller knows it, bounds every
    expert's rows and sizes the launch (by default m: no read of ``offsets`` by the host, more idle programs)."""
    if w.codes.dim() != 3 or offsets.shape != (w.codes.shape[0] + 1,):
        raise ValueError(f"grouped FP8 GEMM takes weights [E, n, k] and E + 1 offsets (got {list(w.codes.shape)}, "
                         f"{list(offsets.shape)})")
    rows = x.codes.shape[0] if max_rows is None else max_rows
    tile = tile or portable_tile(-(-x.codes.shape[0] // w.codes.shape[0]) if max_rows is None else max_rows,
                                 *w.codes.shape[1:])
    return _launch(x, w, offsets, out_dtype, tile, rows)


def fp8_block_gemm(x: TokenGroupsFP8, w: BlockScaledFP8, out_dtype: torch.dtype = torch.bfloat16,
                   tile: GemmTile | None = None) -> torch.Tensor:
    """``y = x W^T`` [m, n] in ``out_dtype`` for one weight slice ``w`` (codes [n, k])."""
    if w.codes.dim() != 2:
        raise ValueError(f"fp8_block_gemm takes one weight [n, k] (got {list(w.codes.shape)}; experts: "
                         f"grouped_fp8_block_gemm)")
    return _launch(x, w, None, out_dtype, tile or portable_tile(x.codes.shape[0], *w.codes.shape),
                   x.codes.shape[0])


def _launch(x: TokenGroupsFP8, w: BlockScaledFP8, offsets: torch.Tensor | None, out_dtype: torch.dtype,
            tile: GemmTile, rows: int) -> torch.Tensor:
    from . import interpreter

    if interpreter.interpreting():
        interpreter.patch_scalar_index()
    _check_operands(x, w)
    experts, n, k = w.codes.shape if offsets is not None else (1, *w.codes.shape)
    m = x.codes.shape[0]
    block_k = w.block[1]
    blocks = blocks_touched(w.start[1], k, block_k)
    splits = max(1, min(tile.split_k, blocks))
    shape = (splits, m, n) if splits > 1 else (1, m, n)
    y = torch.empty(shape, dtype=torch.float32 if splits > 1 else out_dtype, device=x.codes.device)
    if m == 0 or n == 0:
        return y[0].to(out_dtype)
    even = w.start[1] == 0 and k % block_k == 0
    grid = (triton.cdiv(max(rows, 1), tile.block_m), triton.cdiv(n, tile.block_n), experts * splits)
    _fp8_block_gemm_kernel[grid](
        x.codes, x.scales, w.codes, w.scales, y, x.scales if offsets is None else offsets, m, n, k, blocks, splits,
        w.start[0], w.start[1], x.codes.stride(0), x.scales.stride(0), w.codes.stride(0) if offsets is not None else 0,
        w.codes.stride(-2), w.scales.stride(0) if offsets is not None else 0, w.scales.stride(-2), y.stride(1),
        y.stride(0), ROW_BLOCK=w.block[0], BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=block_k, EVEN_K=even,
        GROUPED=offsets is not None, SWAP=tile.swap, num_warps=tile.warps, num_stages=tile.stages)
    return y.sum(0, dtype=torch.float32).to(out_dtype) if splits > 1 else y[0]


def triton_fp8_linear_kernels(tiles: Callable[[int, int, int], GemmTile | None] | None = None) -> FP8LinearKernels:
    """:class:`~splash_core.platform.interfaces.FP8LinearKernels` from these kernels: activations
    quantized by :func:`quantize_token_groups`, results in the activations' dtype. ``tiles(rows, n,
    k)``: a tile measured for that weight and batch (None there: :func:`portable_tile`)."""
    if tiles is None:
        return FP8LinearKernels(linear=_linear, grouped=_grouped, name="triton")

    def linear(x: torch.Tensor, w: BlockScaledFP8) -> torch.Tensor:
        return _linear(x, w, tiles(x.shape[0], *w.codes.shape))

    return FP8LinearKernels(linear=linear, grouped=_grouped, name="triton (measured tiles)")


def _linear(x: torch.Tensor, w: BlockScaledFP8, tile: GemmTile | None = None) -> torch.Tensor:
    return fp8_block_gemm(quantize_token_groups(x, w.start[1], w.block[1]), w, x.dtype, tile)


def _grouped(x: torch.Tensor, w: BlockScaledFP8, counts: torch.Tensor) -> torch.Tensor:
    offsets = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    return grouped_fp8_block_gemm(quantize_token_groups(x, w.start[1], w.block[1]), w, offsets, x.dtype)
