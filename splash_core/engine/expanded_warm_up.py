"""Start-up warm-up of the expanded-form attention provider: a provider that builds a kernel graph
per call shape (torch's cuDNN attention on shape buckets, :meth:`SdpaExpanded.warm_up
<splash_core.kernels.expanded_sdpa.SdpaExpanded.warm_up>`) runs every shape a deployment's prefill
can give it once, before the first request, so no prefill step waits for a graph build (57-950 ms
each on an H100). Run on each rank in the thread that then serves (torch keeps those graphs per
thread). Providers without a warm-up (Triton, the reference) run nothing."""

from __future__ import annotations

import time

import torch

from ..layouts import Layout, Placement
from ..runtime.expanded_attention import PASS_BYTES
from .errors import EngineError


def head_counts(heads: int, T: int, layouts) -> list[int]:
    """Heads one rank attends with in each of ``layouts``: a 1/T share where projections are sharded."""
    return sorted({heads // T if Layout(layout).placement is Placement.SHARDED else heads for layout in layouts})


def warm_expanded(expanded, mla, heads: list[int], dtype, device, streams, max_rows: int, max_context: int) -> dict:
    """Warm ``expanded`` (an ``MLAKernels.expanded``) for every count in ``heads`` at ``mla``'s widths,
    queries of up to ``max_rows`` rows over up to ``max_context`` keys, or as many as one of the
    runtime's passes expands (:data:`~splash_core.runtime.expanded_attention.PASS_BYTES`: no call
    sees more): shapes run and seconds taken."""
    warm = getattr(expanded, "warm_up", None)
    start = time.perf_counter()
    widths = (mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim)
    per_key = (mla.qk_nope_head_dim + mla.v_head_dim) * torch.empty(0, dtype=dtype).element_size()
    shapes = 0 if warm is None else sum(
        warm(h, widths, dtype, device, max_rows, min(max_context, PASS_BYTES // (h * per_key))) for h in heads)
    streams.synchronize()
    return {"shapes": shapes, "seconds": time.perf_counter() - start, "heads": heads, "max_rows": max_rows,
            "max_context": max_context}


def warm_deployment(ctx, deployment, model, layouts, rows: int, context: int) -> dict:
    """:func:`warm_expanded` of ``model``'s provider in ``layouts`` on this rank; running out of memory
    there is an :class:`~splash_core.engine.errors.EngineError` naming the reserve (the provider's
    prefill calls need that scratch too), raised before any request is taken."""
    mla = deployment.model.mla
    try:
        return warm_expanded(model.kernels.expanded, mla, head_counts(mla.heads, ctx.world_size, layouts),
                             model.config.dtype, ctx.device, ctx.streams, rows, context)
    except torch.OutOfMemoryError as exc:
        raise EngineError(f"rank {ctx.rank}: warming the expanded-form prefill provider ran out of device memory "
                          f"({str(exc).splitlines()[0]}); its prefill calls need that scratch beside the KV pool: "
                          f"raise the deployment's reserve_gib (now {deployment.reserve_gib:g}; about 3 GiB at 128 "
                          f"heads and {rows}-row chunks)") from None
