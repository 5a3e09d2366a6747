"""FP8 weights kept as stored: block-scaled e4m3 weight slices, 1 x 128 token-group activations,
and the GEMM ``y = x W^T`` between them as the spec (dequantize, then a float32 matmul).

DeepSeek-V3's checkpoints hold a linear weight ``W`` [out, in] as e4m3 codes and a float32 scale
per 128 x 128 block (``weight_scale_inv``: ``W ≈ code * scale``). A rank reads only its slice
[rows, cols] of that tensor; the slice may start inside a block (a TP shard of 2112 rows is not a
multiple of 128) and its last blocks may be partial, so :class:`BlockScaledFP8` keeps the codes
of the slice, the scales of every block it touches and where it starts inside its first block.

Activations are quantized per token and per group of 128 channels (DeepSeek's recipe). The
groups follow the weight's column blocks, so a column slice starting inside a block has a first
group as short as that block's rest: then every (group, block) pair shares one scale each, and
the GEMM is a sum over blocks of ``(x_codes . w_codes) * x_scale * w_scale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
BLOCK = 128  # DeepSeek-V3's weight_block_size and activation group
TINY_SCALE = 1e-12  # an all-zero group's scale: its codes are zeros, never 0 / 0


def blocks_touched(start: int, length: int, block: int) -> int:
    """How many blocks of ``block`` elements ``length`` elements cover from ``start`` inside the first."""
    return -(-(start + length) // block) if length else 0


def _expanded(scales: torch.Tensor, start: int, length: int, block: int, dim: int) -> torch.Tensor:
    """``scales`` repeated along ``dim`` to one per element of a run of ``length`` from ``start``."""
    return scales.repeat_interleave(block, dim=dim).narrow(dim, start, length)


@dataclass(frozen=True)
class BlockScaledFP8:
    """A slice [n, k] of a block-scaled FP8 weight, as stored (or of each of E experts' weights, stacked).

    ``codes`` [n, k] (or [E, n, k]) float8_e4m3fn; ``scales`` [row blocks, col blocks] (or [E, ...])
    float32, one per block of ``block`` the slice touches; ``start`` (row, col) of the slice's first
    element inside its first block (each in [0, block)). Element (i, j) is ``codes[i, j] *
    scales[(start[0] + i) // block[0], (start[1] + j) // block[1]]``."""

    codes: torch.Tensor
    scales: torch.Tensor
    start: tuple[int, int] = (0, 0)
    block: tuple[int, int] = (BLOCK, BLOCK)

    def __post_init__(self):
        if self.codes.dtype != torch.float8_e4m3fn or self.codes.dim() not in (2, 3):
            raise ValueError(f"FP8 weight codes must be 2-D (or 3-D, experts first) float8_e4m3fn "
                             f"(got {self.codes.dtype} {list(self.codes.shape)})")
        if self.scales.dtype != torch.float32:
            raise ValueError(f"FP8 weight scales must be float32 (got {self.scales.dtype})")
        if not all(0 <= s < b for s, b in zip(self.start, self.block)):
            raise ValueError(f"FP8 weight slice start {self.start} is not inside a {self.block} block")
        grid = (*self.codes.shape[:-2],
                *(blocks_touched(s, n, b) for s, n, b in zip(self.start, self.codes.shape[-2:], self.block)))
        if tuple(self.scales.shape) != grid:
            raise ValueError(f"FP8 weight scales {list(self.scales.shape)} are not the {list(grid)} blocks that "
                             f"{list(self.codes.shape)} codes from {self.start} touch")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    @property
    def stored_bytes(self) -> int:
        """Bytes a rank holds for this slice (codes and scales), what Eq 9 counts."""
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()

    def dequantize(self) -> torch.Tensor:
        """Float32 values [n, k] (or [E, n, k]) of the slice: the spec every FP8 GEMM is checked against."""
        (r0, c0), (b0, b1) = self.start, self.block
        n, k = self.codes.shape[-2:]
        if self.codes.numel() == 0:
            return self.codes.float()
        return self.codes.float() * _expanded(_expanded(self.scales, r0, n, b0, -2), c0, k, b1, -1)

    def rows_reordered(self, order: torch.Tensor) -> "BlockScaledFP8":
        """The slice with row i taken from row ``order[i]`` (e.g. rotary rows from interleaved to
        rotate-half order), which must keep every row inside its scale block: the scales then still hold."""
        rows = self.codes.shape[-2]
        r0, b0 = self.start[0], self.block[0]
        here = torch.arange(rows, device=order.device)
        if order.shape != (rows,) or bool(((r0 + order) // b0 != (r0 + here) // b0).any()):
            raise ValueError(f"row order moves rows across {b0}-row scale blocks (or is not one per row)")
        return BlockScaledFP8(self.codes.index_select(-2, order.to(self.codes.device)), self.scales, self.start,
                              self.block)

    def narrow(self, dim: int, begin: int, length: int) -> "BlockScaledFP8":
        """The part ``[begin, begin + length)`` along ``dim`` (0 rows, 1 columns) of this 2-D slice:
        views of its codes and of the scale blocks that part touches, and where it starts in its first."""
        if self.codes.dim() != 2 or dim not in (0, 1):
            raise ValueError(f"narrowing cuts rows (0) or columns (1) of a 2-D slice (dim {dim}, "
                             f"codes {list(self.codes.shape)})")
        at, b = self.start[dim] + begin, self.block[dim]
        start = list(self.start)
        start[dim] = at % b
        return BlockScaledFP8(self.codes.narrow(dim, begin, length),
                              self.scales.narrow(dim, at // b, blocks_touched(at % b, length, b)), tuple(start),
                              self.block)

    def clone(self) -> "BlockScaledFP8":
        """A copy owning its memory (a narrowed part then no longer holds the whole weight)."""
        return BlockScaledFP8(self.codes.clone(), self.scales.clone(), self.start, self.block)

    def expert(self, e: int) -> "BlockScaledFP8":
        """Expert ``e``'s slice of stacked experts' weights."""
        return BlockScaledFP8(self.codes[e], self.scales[e], self.start, self.block)

    def to(self, device) -> "BlockScaledFP8":
        return BlockScaledFP8(self.codes.to(device), self.scales.to(device), self.start, self.block)


@dataclass(frozen=True)
class StackedFP8:
    """A weight kept FP8 as stored whose ``parts`` (:class:`BlockScaledFP8`, each [n_i, k] or [E, n_i,
    k], e.g. a gate and an up projection) the model computes with stacked along rows: :meth:`dequantize`
    gives, in ``dtype``, exactly the tensor a dequantize-at-load model holds, without keeping it."""

    parts: tuple[BlockScaledFP8, ...]
    dtype: torch.dtype

    def __post_init__(self):
        if not self.parts or len({(p.codes.shape[:-2], p.codes.shape[-1]) for p in self.parts}) != 1:
            raise ValueError(f"FP8 parts stacked along rows need one column width and expert count (got "
                             f"{[list(p.shape) for p in self.parts]})")

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.parts[0].shape
        return (*first[:-2], sum(p.shape[-2] for p in self.parts), first[-1])

    @property
    def stored_bytes(self) -> int:
        return sum(p.stored_bytes for p in self.parts)

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts], dim=-2).to(self.dtype)


def stacked_rows(parts: tuple[BlockScaledFP8, ...], dtype: torch.dtype) -> StackedFP8:
    """2-D ``parts`` (e.g. a gate and an up projection) stacked along rows, :func:`joined` into one
    slice where they meet on block boundaries (each starts a row block, all but the last fill their
    last one): one GEMM then computes them all, with one quantization of the activations and no
    concatenation of the outputs. Otherwise kept apart (a TP shard starting mid-block). Either way
    :meth:`StackedFP8.dequantize` is the same tensor."""
    first = parts[0]
    if len(parts) > 1 and all(p.start[0] == 0 for p in parts) and \
            all(p.codes.shape[0] % first.block[0] == 0 for p in parts[:-1]):
        parts = (joined(list(parts), 0),)
    return StackedFP8(tuple(parts), dtype)


def joined(parts: list[BlockScaledFP8], dim: int, codes: torch.Tensor | None = None) -> BlockScaledFP8:
    """Adjacent 2-D slices ``parts`` of one weight, in order along ``dim`` (0 rows, 1 columns), as one
    slice: their codes concatenated (or ``codes``, that concatenation already made, e.g. by a gather)
    and their scales placed on one block grid. Two parts meeting inside a block both hold that
    block's scale, which must be equal: ValueError otherwise (a part that carries a wrong block), as
    for parts that are not adjacent (a part must start where the one before it ends, inside its block)."""
    first, other = parts[0], 1 - dim
    b, at = first.block[dim], first.start[dim]
    total = sum(p.codes.shape[dim] for p in parts)
    shape = list(first.scales.shape)
    shape[dim] = blocks_touched(at, total, b)
    grid = first.scales.new_empty(shape)
    filled = 0  # blocks of the grid set so far
    for i, p in enumerate(parts):
        if (p.block != first.block or p.start[other] != first.start[other] or p.start[dim] != at % b
                or p.scales.shape[other] != shape[other]):
            raise ValueError(f"FP8 part {i} (from {p.start} in {p.block} blocks, codes {list(p.codes.shape)}) does "
                             f"not continue the parts before it along dim {dim}")
        lo, n = at // b - first.start[dim] // b, p.scales.shape[dim]
        if lo < filled and not torch.equal(grid.narrow(dim, lo, filled - lo), p.scales.narrow(dim, 0, filled - lo)):
            raise ValueError(f"FP8 parts {i - 1} and {i} disagree on the scale of the block they share along dim "
                             f"{dim} (block {at // b})")
        grid.narrow(dim, lo, n).copy_(p.scales)
        filled, at = max(filled, lo + n), at + p.codes.shape[dim]
    codes = torch.cat([p.codes for p in parts], dim=dim) if codes is None else codes
    return BlockScaledFP8(codes, grid, first.start, first.block)


def stack_experts(slices: Iterable[BlockScaledFP8], count: int, shape: tuple[int, int], device=None) -> BlockScaledFP8:
    """``count`` whole experts' weights of ``shape`` [n, k] (each a slice from (0, 0), all in one block
    size) stacked [E, n, k]; none: an empty stack on ``device``. ``slices`` is read one at a time
    into the stack, so a generator holds one expert beside it while loading."""
    codes = scales = block = None
    i = -1
    for i, s in enumerate(slices):
        if codes is None:
            block = s.block
            grid = tuple(blocks_touched(0, n, b) for n, b in zip(shape, block))
            codes = torch.empty(count, *shape, dtype=torch.float8_e4m3fn, device=s.codes.device)
            scales = torch.empty(count, *grid, dtype=torch.float32, device=s.codes.device)
        if s.start != (0, 0) or s.shape != tuple(shape) or s.block != block or i >= count:
            raise ValueError(f"stacked experts must be {count} whole {list(shape)} weights in one block size")
        codes[i].copy_(s.codes)
        scales[i].copy_(s.scales)
    if i + 1 != count:
        raise ValueError(f"{count} experts to stack, {i + 1} given")
    if codes is not None:
        return BlockScaledFP8(codes, scales, block=block)
    grid = tuple(blocks_touched(0, n, b) for n, b in zip(shape, (BLOCK, BLOCK)))
    return BlockScaledFP8(torch.empty(0, *shape, dtype=torch.float8_e4m3fn, device=device),
                          torch.empty(0, *grid, device=device))


def slice_of(codes: torch.Tensor, scales: torch.Tensor, rows: slice, cols: slice,
             block: tuple[int, int] = (BLOCK, BLOCK)) -> BlockScaledFP8:
    """The slice [rows, cols] (unit steps) of a whole stored weight: its ``codes`` and scale grid ``scales``."""
    rows, cols = (slice(*s.indices(n)) for s, n in zip((rows, cols), codes.shape))
    if rows.step != 1 or cols.step != 1 or rows.stop < rows.start or cols.stop < cols.start:
        raise ValueError(f"FP8 weight slices are increasing runs of step 1 (got {rows}, {cols})")
    return BlockScaledFP8(codes[rows, cols], scales[covering(rows, block[0]), covering(cols, block[1])],
                          (rows.start % block[0], cols.start % block[1]), block)


def covering(part: slice, block: int) -> slice:
    """The blocks of ``block`` elements that the elements ``part`` (start and stop set, step 1) touch."""
    first = part.start // block
    return slice(first, first + blocks_touched(part.start % block, part.stop - part.start, block))


@dataclass(frozen=True)
class TokenGroupsFP8:
    """Activations [m, k] quantized per token and group: ``codes`` [m, k] float8_e4m3fn, ``scales``
    [m, groups] float32; the groups are ``group`` channels wide, the first starting ``start``
    channels inside a group (the column start of the weight slice it multiplies)."""

    codes: torch.Tensor
    scales: torch.Tensor
    start: int = 0
    group: int = BLOCK

    def __post_init__(self):
        if self.codes.dtype != torch.float8_e4m3fn or self.codes.dim() != 2:
            raise ValueError(f"FP8 activation codes must be 2-D float8_e4m3fn (got {self.codes.dtype} "
                             f"{list(self.codes.shape)})")
        want = (self.codes.shape[0], blocks_touched(self.start, self.codes.shape[1], self.group))
        if self.scales.dtype != torch.float32 or tuple(self.scales.shape) != want:
            raise ValueError(f"FP8 activation scales must be float32 {list(want)} (got {self.scales.dtype} "
                             f"{list(self.scales.shape)})")

    def dequantize(self) -> torch.Tensor:
        if self.codes.numel() == 0:
            return self.codes.float()
        return self.codes.float() * _expanded(self.scales, self.start, self.codes.shape[1], self.group, 1)


def quantize_tokens(x: torch.Tensor, start: int = 0, group: int = BLOCK) -> TokenGroupsFP8:
    """``x`` [m, k] in e4m3 per token and group of ``group`` channels (the first group ``group -
    start`` wide): each group's largest magnitude maps to the largest e4m3 value."""
    m, k = x.shape
    padded = torch.nn.functional.pad(x.float(), (start, blocks_touched(start, k, group) * group - start - k))
    tiles = padded.unflatten(1, (-1, group))
    amax = tiles.abs().amax(dim=2)
    # Divided by a tensor, not a Python number: torch divides by a number as a product with its
    # reciprocal on some devices, which would make the spec's scales differ between devices.
    scales = (amax / torch.full_like(amax, E4M3_MAX)).clamp(min=TINY_SCALE)
    codes = tiles.div(scales[:, :, None]).flatten(1)[:, start: start + k].to(torch.float8_e4m3fn)
    return TokenGroupsFP8(codes, scales, start, group)


def reference_gemm(x: TokenGroupsFP8, w: BlockScaledFP8) -> torch.Tensor:
    """``y = x W^T`` [m, n] in float32 from the dequantized operands: the spec of FP8 block GEMMs."""
    if x.codes.shape[1] != w.codes.shape[1] or x.start != w.start[1] or x.group != w.block[1]:
        raise ValueError(f"activations [{x.codes.shape[1]} channels from {x.start} in groups of {x.group}] do not "
                         f"match the weight's columns [{w.codes.shape[1]} from {w.start[1]} in blocks of "
                         f"{w.block[1]}]")
    return x.dequantize() @ w.dequantize().T


def gemm_mismatch(got: torch.Tensor, want: torch.Tensor, tolerance: float) -> str:
    """Why ``got`` is not ``want`` within ``tolerance`` (the largest error's share of ``want``'s
    largest magnitude), or "" when it is. Empty outputs, shapes that differ and non-finite values
    in either are mismatches, whatever the tolerance."""
    if got.shape != want.shape:
        return f"shape {list(got.shape)} is not {list(want.shape)}"
    if got.numel() == 0:
        return "empty output"
    for what, t in (("output", got), ("expected output", want)):
        if not bool(torch.isfinite(t).all()):
            where = tuple(int(i) for i in torch.nonzero(~torch.isfinite(t))[0])
            return f"{what} is not finite at {where}"
    error = relative_error(got, want)
    return "" if error <= tolerance else f"error {error:.3g} of the largest |value| is above {tolerance:.3g}"


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest |got - want| as a share of the largest |want| (of 1 when ``want`` is all zeros)."""
    scale = float(want.float().abs().max()) or 1.0
    return float((got.float() - want.float()).abs().max()) / scale
