"""KDA kernels from flash-linear-attention (``fla-core``), imported only when asked for.

fla's Triton kernels target the same GPU families as ours. ``chunk_kda`` runs prefill
chunks, ``fused_recurrent_kda`` runs decode steps; both take the recurrent state
[B, H, K, V] float32 and hand back the state after the last token, which is what a switch
moves for KDA layers.
"""

from __future__ import annotations

from ..platform.interfaces import KDAKernels


def fla_missing_reason() -> str | None:
    """None when fla's KDA kernels import, else why not (one line)."""
    try:
        from fla.ops.kda import chunk_kda, fused_recurrent_kda  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything else
        return f"flash-linear-attention (fla-core) unavailable: {type(exc).__name__}: {exc}"
    return None


def _chunk(q, k, v, g, beta, state, scale):
    from fla.ops.kda import chunk_kda

    o, final = chunk_kda(q=q, k=k, v=v, g=g, beta=beta, scale=scale,
                         initial_state=state.float().contiguous(), output_final_state=True)
    return o, final


def _step(q, k, v, g, beta, state, scale):
    from fla.ops.kda import fused_recurrent_kda

    o, final = fused_recurrent_kda(q=q, k=k, v=v, g=g, beta=beta, scale=scale,
                                   initial_state=state.float().contiguous(), output_final_state=True)
    return o, final


def fla_kda_kernels() -> KDAKernels | None:
    """:class:`~splash_core.platform.interfaces.KDAKernels` through fla, or None if fla is missing."""
    if fla_missing_reason() is not None:
        return None
    return KDAKernels(chunk=_chunk, step=_step, name="fla")
