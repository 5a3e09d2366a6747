"""Portable Triton kernels (Triton targets several GPU families; nothing here is specific
to one). A backend picks an :class:`MLAKernelConfig` for its device and calls
:func:`triton_mla_kernels`; expanded (MHA-form) prefill attention over kv_b-expanded keys
comes from :func:`triton_expanded_attention` with an :class:`ExpandedTile`; KDA kernels come
from flash-linear-attention through :func:`fla_kda_kernels` when it is installed.

Importing this package is cheap: the Triton modules load when kernels are first asked for
(``TRITON_INTERPRET=1`` must be set before that to run them on a CPU).
"""

from __future__ import annotations

import functools

from ..platform.interfaces import FusedKernels, MLAKernels
from .config import PORTABLE, AttentionTile, ExpandedTile, MLAKernelConfig, TileRule
from .kda import fla_kda_kernels, fla_missing_reason


def triton_mla_kernels(config: MLAKernelConfig = PORTABLE, expanded_tile: ExpandedTile = ExpandedTile()) -> MLAKernels:
    """:class:`~splash_core.platform.interfaces.MLAKernels` running the Triton kernels with ``config`` (the
    expanded form with ``expanded_tile``)."""
    from . import attention, dsa_attention, dsa_dequantized, dsa_indexer, interpreter, merge, pages

    if interpreter.interpreting():
        interpreter.patch_scalar_index()
    return MLAKernels(
        decode=functools.partial(attention.paged_attention, config=config, entry="decode", plans={}),
        extend=functools.partial(attention.paged_attention, config=config, entry="extend", plans={}),
        merge=merge.merge,
        pack=functools.partial(pages.pack, config=config),
        unpack=functools.partial(pages.unpack, config=config),
        name=f"triton:{config.name}",
        expanded=triton_expanded_attention(expanded_tile),
        index_scores=dsa_indexer.indexer_scores,
        sparse=dsa_dequantized.prefill_on_dequantized(dsa_attention.sparse_attention),
    )


def triton_expanded_attention(config: ExpandedTile = ExpandedTile()):
    """Expanded (MHA-form) MLA attention over packed keys for chunked prefill, in Triton with the
    tile ``config``: ``fn(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale) -> (out, lse)``
    (contract: :mod:`splash_core.kernels.expanded`)."""
    from . import expanded, interpreter

    if interpreter.interpreting():
        interpreter.patch_scalar_index()
    return functools.partial(expanded.expanded_attention, tile=config)


def triton_fused_kernels() -> FusedKernels:
    """:class:`~splash_core.platform.interfaces.FusedKernels` in Triton (residual add + RMSNorm, RoPE with
    the latent-cache write, SiLU·mul), one program per row: nothing a device must tune."""
    from . import fused, interpreter

    if interpreter.interpreting():
        interpreter.patch_scalar_index()
    return fused.KERNELS


__all__ = ["PORTABLE", "AttentionTile", "ExpandedTile", "MLAKernelConfig", "TileRule", "fla_kda_kernels",
           "fla_missing_reason", "triton_expanded_attention", "triton_fused_kernels", "triton_mla_kernels"]
