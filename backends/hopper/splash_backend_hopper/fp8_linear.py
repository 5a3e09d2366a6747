"""Which kernel serves an FP8 block-scaled GEMM on Hopper: SPLASH's Triton kernel, or torch's
``scaled_mm`` with DeepSeek's block scales (cuBLAS, :mod:`splash_core.kernels.fp8_scaled_mm`) from
the number of activation rows ``bench/fp8_gemm.py`` measured it faster at every larger point
(``tuned/providers.json``'s ``fp8_linear`` entry, ``scaled_mm_from_rows``). cuBLAS takes whole
128-blocks only: a TP slice starting inside a block (DeepSeek-V3's fused q_a/kv_a at T = 8) and the
grouped experts stay on Triton. Without a measured entry, or where this torch cannot multiply block
scales, Triton serves every call; it computes in the tiles measured fastest for the weight and batch
(``fp8_tiles``), else in its portable ones. Imported where the hook is called (it loads Triton).
"""

from __future__ import annotations

import functools

from splash_core.kernels.fp8_block_gemm import GemmTile, quantize_token_groups, triton_fp8_linear_kernels
from splash_core.kernels.fp8_scaled_mm import available, fits, scaled_mm_linear
from splash_core.platform.interfaces import FP8LinearKernels

from . import providers


@functools.lru_cache(maxsize=None)
def _unavailable(device: str) -> str:
    return available(device)


def measured_tiles(table: dict | None = None):
    """``tiles(rows, n, k)``: the tile ``bench/fp8_gemm.py`` measured fastest for a weight [n, k] at
    the fewest measured rows holding ``rows`` (None: not measured there); None without any."""
    measured = providers.fp8_tiles(table)
    if not measured:
        return None

    def tile(rows: int, n: int, k: int) -> GemmTile | None:
        for most, fields in measured.get((n, k), ()):
            if rows <= most:
                return GemmTile(*fields[:5], swap=bool(fields[5]))
        return None

    return tile


def kernels(device, table: dict | None = None) -> FP8LinearKernels:
    """Triton's FP8 GEMMs (in the measured tiles where there are), with ``linear`` handed to cuBLAS
    for whole-block weights from the measured row count; both listed as ``providers`` for the
    conformance suite where cuBLAS runs."""
    triton = triton_fp8_linear_kernels(measured_tiles(table))
    if _unavailable(str(device)):
        return triton
    cublas = scaled_mm_linear(quantize_token_groups)
    every = (("triton", triton.linear), ("scaled_mm", cublas))
    threshold = providers.scaled_mm_from_rows(table)
    if threshold is None:
        return FP8LinearKernels(triton.linear, triton.grouped, "triton (scaled_mm not measured faster)", every)

    def linear(x, w):
        return cublas(x, w) if x.shape[0] >= threshold and fits(w) else triton.linear(x, w)

    return FP8LinearKernels(linear, triton.grouped, f"scaled_mm from {threshold} rows on whole blocks, else triton",
                            every)

