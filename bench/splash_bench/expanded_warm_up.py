"""The warm-up of a backend's expanded-form provider on a rank
(:meth:`~splash_core.kernels.expanded_sdpa.SdpaExpanded.warm_up`), run in the rank's process (torch
keeps cuDNN's graphs per thread: the thread that serves) before a benchmark's timed runs."""

from __future__ import annotations

from splash_core import dtypes
from splash_core.engine.expanded_warm_up import warm_expanded as warm
from splash_core.profiles import load


def warm_expanded(ctx, deployment_spec: dict, max_rows: int, max_context: int) -> dict:
    """The warm-up of the backend's expanded-form provider, where it has one (the SDPA provider on
    shape buckets: every bucket's cuDNN graph built before the timed runs): shapes run, seconds."""
    dep = load("deployment", deployment_spec)
    mla, dtype = dep.model.mla, dtypes.torch_dtype(dep.compute_dtype)
    expanded = ctx.backend.mla_kernels(ctx.device, dtype).expanded
    return warm(expanded, mla, [mla.heads // ctx.world_size], dtype, ctx.device, ctx.streams, max_rows, max_context)
