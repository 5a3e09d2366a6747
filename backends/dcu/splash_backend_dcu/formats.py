"""Weight and KV-cache formats a ROCm device can serve (paper §H: INT8 weights, FP8 KV).

INT8 weights are dequantised by the projections before they reach the attention kernels,
so every device takes them. An FP8 KV cache is read by the Triton kernels and widened to
the compute dtype in registers; that needs FP8 conversions in hardware, which CDNA3/4
(gfx942, gfx950) have and which the paper ran on BW1000. gfx942 uses the ``fnuz`` FP8
encoding, the others the OCP one.
"""

from __future__ import annotations

import dataclasses

FP8_ARCHES = {"gfx942": "float8_e4m3fnuz", "gfx950": "float8_e4m3fn"}
FP8_DEVICE_NAMES = {"BW1000": "float8_e4m3fn"}


@dataclasses.dataclass(frozen=True)
class Formats:
    """Element formats by SPLASH name (see :mod:`splash_core.dtypes`)."""

    weights: tuple[str, ...]
    kv: tuple[str, ...]
    fp8_torch_dtype: str | None  # the torch dtype an "fp8" KV cache uses here, if any


def formats_for(arch: str, device_name: str = "") -> Formats:
    fp8 = FP8_ARCHES.get(arch) or next((d for n, d in FP8_DEVICE_NAMES.items() if n in device_name), None)
    return Formats(weights=("bf16", "fp16", "int8"), kv=("bf16", "fp16") + (("fp8",) if fp8 else ()),
                   fp8_torch_dtype=fp8)
