"""Hook implementations of the Hopper backend (entry point ``splash = hopper``).

Refines ``cuda``: same device, NCCL and stream handling (shared code), plus the kernel
tiles measured on an H200 (``tuned/h200.json``) and the calibrated ``h200`` profile.
"""

from __future__ import annotations

from splash_backend_cuda import common, detect
# cuda's implementations of the hooks Hopper does not refine (device, NCCL, streams, peer memory,
# KDA kernels), registered as this plugin's too: the fallback along ``specializes`` would find
# them in cuda, but not where SPLASH_BACKENDS leaves cuda out, and then the reference's CPU answers
from splash_backend_cuda.plugin import (splash_device, splash_fused_kernels, splash_graph_ops,  # noqa: F401
                                        splash_kda_kernels, splash_make_collectives, splash_peer_memory,
                                        splash_process_group_backend, splash_side_group_options, splash_stream_ops)

from splash_core.kernels.config import decode_shaped
from splash_core.platform.hookspecs import hookimpl
from splash_core.platform.interfaces import BackendInfo

from . import __version__, flashmla, providers, tuned


@hookimpl
def splash_backend_info():
    return BackendInfo(
        name="hopper",
        version=__version__,
        summary=("NVIDIA Hopper (sm_90, H100/H200): H200-measured Triton MLA tiles, NCCL, calibrated h200 profile; "
                 + providers.describe(flashmla.missing_reason()) + "; " + providers.describe_expanded() + "; "
                 + providers.describe_fp8_linear()),
        device_type="cuda",
        accelerator=True,
        specializes="cuda",
    )


@hookimpl
def splash_backend_check():
    reason = detect.unavailable_reason()
    if reason:
        return reason
    if detect.capability(0) != (9, 0):
        return f"needs sm_90 (H100/H200), found {detect.sm(0)} ({detect.name(0)})"
    return None


@hookimpl
def splash_mla_kernels(device, dtype):
    import dataclasses

    from splash_core.kernels import triton_mla_kernels

    config, _ = tuned.load()
    kernels = with_expanded_choice(triton_mla_kernels(config.with_processors(detect.processors(device))))
    if flashmla.missing_reason():
        return kernels
    table = providers.load()
    measured = [t for key in providers.TABLES.values() for t in table.get(key, {}).values()]
    if any(t is not None for t in measured):
        kernels = dataclasses.replace(kernels, decode=by_heads(flashmla.decode(kernels.decode), kernels.decode),
                                      name=f"{kernels.name}+flashmla")
    if providers.sparse_somewhere(table):
        kernels = dataclasses.replace(kernels, sparse=by_format(flashmla.sparse(kernels.sparse), kernels.sparse),
                                      name=f"{kernels.name}+flashmla-sparse")
    return kernels


def with_expanded_choice(kernels):
    """``kernels`` whose expanded form runs torch's cuDNN attention where the measured table chose
    it for the call's heads and rows (Triton for the rest, and for requests a dense call cannot
    express), in the shape buckets it was measured with; unchanged where nothing was measured."""
    import dataclasses

    from torch.nn.attention import SDPBackend

    from splash_core.kernels.expanded_buckets import BucketSizes
    from splash_core.kernels.expanded_choice import ExpandedChoice
    from splash_core.kernels.expanded_sdpa import sdpa_expanded_attention

    if not providers.sdpa_somewhere():
        return kernels
    buckets = providers.expanded_buckets()
    sdpa = sdpa_expanded_attention(SDPBackend.CUDNN_ATTENTION, fallback=kernels.expanded,
                                   buckets=None if buckets is None else BucketSizes(**buckets))
    choice = ExpandedChoice((("triton", kernels.expanded), ("sdpa", sdpa)), providers.expanded_provider)
    return dataclasses.replace(kernels, expanded=choice, name=f"{kernels.name}+sdpa-expanded")


def by_format(flashmla_sparse, triton_sparse):
    """A sparse attention that runs the provider the measured table chose for the cache's format and
    the call's phase (decode: at most a row per request of the block table; else prefill)."""
    def sparse(q, kv_cache, block_table, *args):
        kv = "bf16" if kv_cache.dtype.is_floating_point else "fp8"
        phase = "decode" if decode_shaped(q.shape[0], block_table.shape[0]) else "prefill"
        chosen = providers.sparse_provider(kv, phase=phase) == "flashmla"
        return (flashmla_sparse if chosen else triton_sparse)(q, kv_cache, block_table, *args)

    return sparse


def by_heads(flashmla_decode, triton_decode):
    """A decode that runs whichever provider the measured table chose for the call's heads. The
    KV tokens it weighs are the query rows' (one request each in decode) times the table's width:
    a captured decode step's table has a row for every request slot, not only the batch's."""
    def decode(q, kv_cache, block_table, *args):
        kv_tokens = q.shape[0] * block_table.shape[1] * kv_cache.shape[1]
        kv = "bf16" if kv_cache.dtype.is_floating_point else "fp8"  # uint8: the scaled-fp8 format
        chosen = (flashmla_decode if providers.decode_provider(q.shape[1], kv_tokens, kv=kv) == "flashmla"
                  else triton_decode)
        return chosen(q, kv_cache, block_table, *args)

    return decode


@hookimpl
def splash_hardware_profile():
    if detect.unavailable_reason() is None and "H200" in detect.name(0):
        return "h200"
    return None


@hookimpl
def splash_calibrate(collectives, device, options):
    return common.calibrate(collectives, device, options, splash_mla_kernels(device, options.get("dtype")))


@hookimpl
def splash_fp8_linear_kernels(device, dtype):
    from . import fp8_linear

    return fp8_linear.kernels(device)
