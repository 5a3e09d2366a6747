"""Which MLA kernels a benchmark runs (a module of its own: it needs only the runtime's public
API, so it also serves an older checkout's ``splash_core`` measured beside this one)."""

from __future__ import annotations

import torch

from splash_core.platform.interfaces import MLAKernels


def kernels_for(ctx, dtype: torch.dtype, which: str) -> MLAKernels:
    """The backend's MLA kernels, or (``which == 'reference'``) the torch reference on the rank's device."""
    if which == "reference":
        from splash_core.reference import plugin

        return plugin.splash_mla_kernels(ctx.device, dtype)
    return ctx.backend.mla_kernels(ctx.device, dtype)
