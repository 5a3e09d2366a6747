"""ROCm-friendly tiles of the portable Triton MLA kernels.

DCUs and CDNA GPUs up to gfx942 give a workgroup 64 KiB of LDS (shared memory), so tiles
stay small (16 keys, one stage, as SGLang runs MLA on ROCm) and use no NVIDIA-only features
(no TMA, no warp specialisation). ``waves_per_eu`` is an option of Triton's AMD compiler
(the NVIDIA compiler rejects it), so these tiles run on ROCm and in the interpreter only. None of this has run on a real DCU: no ROCm machine was
available, and CI checks these tiles only through Triton's interpreter.
"""

from __future__ import annotations

import dataclasses

from splash_core.kernels import AttentionTile, MLAKernelConfig

LDS_BYTES = {"gfx950": 160 * 1024}  # everything else: 64 KiB
DEFAULT_LDS = 64 * 1024
MLA_DIMS = (512, 64)

ROCM = MLAKernelConfig(
    name="rocm-64k",
    decode=AttentionTile(rows=1, heads=16, keys=16, warps=4, stages=1),
    # One row: unpipelined, a key tile is held twice (loaded and as an operand), and 32 query
    # rows x heads would push the estimate past 64 KiB.
    extend=AttentionTile(rows=1, heads=16, keys=16, warps=4, stages=1),
    shared_memory_bytes=DEFAULT_LDS,
    launch_options=(("waves_per_eu", 1),),
)


def config_for(arch: str, processors: int) -> MLAKernelConfig:
    """The tiles for a gfx architecture, checked against its LDS for the MLA dims."""
    config = dataclasses.replace(ROCM, shared_memory_bytes=LDS_BYTES.get(arch, DEFAULT_LDS))
    return config.with_processors(processors).validate(*MLA_DIMS, 2)
