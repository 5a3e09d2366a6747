"""Reading a rank's slice of an FP8 block-scaled checkpoint tensor as stored, without
dequantizing: the e4m3 codes of the slice and the float32 scales of the blocks it touches
(:class:`~splash_core.model.fp8_blocks.BlockScaledFP8`), through safetensors' lazy slices, so a
rank reads only its shard's codes and the scale rows and columns that cover it.
"""

from __future__ import annotations

from pathlib import Path

from ..model.fp8_blocks import BLOCK, BlockScaledFP8, covering
from ..profiles.checkpoint_family import CheckpointError
from .fp8 import scale_name


def read_block_scaled(handle, name: str, rows: slice | None = None, cols: slice | None = None,
                      block: tuple[int, int] = (BLOCK, BLOCK), where: str = "(checkpoint)") -> BlockScaledFP8:
    """The slice [rows, cols] of the stored FP8 weight ``name`` and its ``{name}_scale_inv`` blocks,
    read from ``handle`` (an open ``safetensors.safe_open``; ``where`` names its file in errors).

    Raises :class:`CheckpointError` for a weight that is missing, not 2-D e4m3, without its scales or
    whose scale grid is not the ``block`` grid of its shape, and for slices that are not increasing
    runs inside the weight."""
    keys = set(handle.keys())
    if name not in keys:
        raise CheckpointError(where, name, "tensor missing from the checkpoint")
    part = handle.get_slice(name)
    full = tuple(part.get_shape())
    if part.get_dtype() != "F8_E4M3" or len(full) != 2:
        raise CheckpointError(where, name, f"not a 2-D FP8 e4m3 weight ({part.get_dtype()} {list(full)})")
    if scale_name(name) not in keys:
        raise CheckpointError(where, name, f"FP8 weight without {scale_name(name)}")
    scales = handle.get_slice(scale_name(name))
    grid = [-(-n // b) for n, b in zip(full, block)]
    if list(scales.get_shape()) != grid or scales.get_dtype() != "F32":
        raise CheckpointError(where, scale_name(name), f"{scales.get_dtype()} {list(scales.get_shape())} is not the "
                                                       f"float32 {block[0]}x{block[1]} block grid {grid} of the weight")
    rows, cols = (_run(s, n, where, name) for s, n in zip((rows or slice(None), cols or slice(None)), full))
    return BlockScaledFP8(part[rows, cols], scales[covering(rows, block[0]), covering(cols, block[1])],
                          (rows.start % block[0], cols.start % block[1]), block)


def read_block_scaled_file(file: str | Path, name: str, rows: slice | None = None, cols: slice | None = None,
                           block: tuple[int, int] = (BLOCK, BLOCK)) -> BlockScaledFP8:
    """:func:`read_block_scaled` from the safetensors ``file`` (opened for this read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            return read_block_scaled(handle, name, rows, cols, block, where=str(file))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(str(file), "(file)", f"not a readable safetensors file: {exc}") from None


def _run(part: slice, size: int, where: str, name: str) -> slice:
    """``part`` with start and stop set inside ``size``; a step or a reversed run is refused."""
    start, stop, step = part.indices(size)
    if step != 1 or stop < start:
        raise CheckpointError(where, name, f"slice {part} is not an increasing run of step 1 inside {size}")
    return slice(start, stop)
