"""Portable Triton kernels (Triton targets several GPU families; nothing here is specific
to one). A backend picks an :class:`MLAKernelConfig` for its device and calls
:func:`triton_mla_kernels`; KDA kernels come from flash-linear-attention through
:func:`fla_kda_kernels` when it is installed.

Importing this package is cheap: the Triton modules load when kernels are first asked for
(``TRITON_INTERPRET=1`` must be set before that to run them on a CPU).
"""

from __future__ import annotations

import dataclasses
import functools

from ..interfaces import MLAKernels
from .config import PORTABLE, AttentionTile, MLAKernelConfig, TileRule
from .kda import fla_kda_kernels, fla_missing_reason


def triton_mla_kernels(config: MLAKernelConfig = PORTABLE) -> MLAKernels:
    """:class:`~splash_core.interfaces.MLAKernels` running the Triton kernels with ``config``;
    their ``sharing`` kernels run attention in ``config.sharing_waves`` waves (when above 1)."""
    from . import interpreter

    if interpreter.interpreting():
        interpreter.patch_scalar_index()
    kernels = _kernels(config, min_waves=1)
    if config.sharing_waves > 1:
        kernels = dataclasses.replace(kernels, sharing=_kernels(config, min_waves=config.sharing_waves))
    return kernels


def _kernels(config: MLAKernelConfig, min_waves: int) -> MLAKernels:
    from . import attention, merge, pages

    def attend(entry):
        return functools.partial(attention.paged_attention, config=config, entry=entry, plans={}, min_waves=min_waves)

    return MLAKernels(
        decode=attend("decode"),
        extend=attend("extend"),
        merge=merge.merge,
        pack=functools.partial(pages.pack, config=config),
        unpack=functools.partial(pages.unpack, config=config),
        name=f"triton:{config.name}" + (f" ({min_waves} waves)" if min_waves > 1 else ""),
    )


__all__ = ["PORTABLE", "AttentionTile", "MLAKernelConfig", "TileRule", "fla_kda_kernels", "fla_missing_reason",
           "triton_mla_kernels"]
