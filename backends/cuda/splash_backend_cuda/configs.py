"""Tiles of the portable Triton MLA kernels for NVIDIA devices.

``GENERIC`` is the SGLang-style tile every NVIDIA GPU since sm_80 compiles; ``SMALL`` fits
64 KiB of shared memory for older or smaller parts. ``B200`` (sm_100) takes the Hopper
defaults (same 228 KiB of shared memory) and has not been measured: no B200 was available.
"""

from __future__ import annotations

import dataclasses

from splash_core.kernels import AttentionTile, MLAKernelConfig

MLA_DIMS = (512, 64)  # d_c, d_r of every MLA model SPLASH ships profiles for

GENERIC = MLAKernelConfig(
    name="cuda-generic",
    # Three stages: two key tiles of decode in flight (~94 KB: fits sm_80 and sm_86/89 parts).
    decode=AttentionTile(rows=1, heads=16, keys=32, warps=4, stages=3),
    extend=AttentionTile(rows=2, heads=16, keys=32, warps=4, stages=2),
)
SMALL = MLAKernelConfig(
    name="cuda-small",
    decode=AttentionTile(rows=1, heads=16, keys=16, warps=4, stages=1),
    extend=AttentionTile(rows=1, heads=16, keys=16, warps=4, stages=1),
)
B200 = MLAKernelConfig(
    name="b200-untuned",
    decode=AttentionTile(rows=1, heads=16, keys=32, warps=4, stages=3),
    extend=AttentionTile(rows=4, heads=16, keys=32, warps=8, stages=3, resident=1),
    shared_memory_bytes=232448,
)


def config_for(sm: str, processors: int, shared_memory: int, elem_bytes: int = 2) -> MLAKernelConfig:
    """The config for a device: B200's on sm_100, else the largest tile that fits."""
    candidates = [B200] if sm == "sm_100" else [GENERIC, SMALL]
    for config in candidates:
        config = config.with_processors(processors)
        if shared_memory:
            config = dataclasses.replace(config, shared_memory_bytes=shared_memory)
        try:
            return config.validate(*MLA_DIMS, elem_bytes)
        except ValueError:
            continue
    return SMALL.with_processors(processors)
