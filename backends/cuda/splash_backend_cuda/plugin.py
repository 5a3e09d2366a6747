"""Hook implementations of the generic NVIDIA backend (entry point ``splash = cuda``).

Any CUDA device works; sm_100 (B200) gets its own tiles and the paper-derived B200
profile. Hopper parts are refined by the ``hopper`` backend, which ``auto`` prefers.
"""

from __future__ import annotations

from splash_core.platform.hookspecs import hookimpl
from splash_core.platform.interfaces import BackendInfo

from . import __version__, common, configs, detect


@hookimpl
def splash_backend_info():
    return BackendInfo(
        name="cuda",
        version=__version__,
        summary="NVIDIA GPUs: portable Triton MLA kernels, NCCL, CUDA streams; B200 (sm_100) tiles",
        device_type="cuda",
        accelerator=True,
    )


@hookimpl
def splash_backend_check():
    return detect.unavailable_reason()


@hookimpl
def splash_device(local_rank):
    return common.device(local_rank)


@hookimpl
def splash_process_group_backend():
    return common.process_group_backend()


@hookimpl
def splash_side_group_options(transfer):
    return common.side_group_options(transfer)


@hookimpl
def splash_make_collectives(group, device, side, transfer):
    return common.collectives(group, device, side, transfer)


@hookimpl
def splash_stream_ops(device):
    return common.stream_ops(device)


@hookimpl
def splash_peer_memory(collectives, device):
    from .peer_memory import CudaPeerMemory

    return CudaPeerMemory(collectives, device)


def kernel_config(device):
    return configs.config_for(detect.sm(device.index or 0), detect.processors(device), detect.shared_memory(device))


@hookimpl
def splash_mla_kernels(device, dtype):
    from splash_core.kernels import triton_mla_kernels

    return triton_mla_kernels(kernel_config(device))


@hookimpl
def splash_fused_kernels(device, dtype):
    from splash_core.kernels import triton_fused_kernels

    return triton_fused_kernels()


@hookimpl
def splash_fp8_linear_kernels(device, dtype):
    from splash_core.kernels.fp8_block_gemm import triton_fp8_linear_kernels

    return triton_fp8_linear_kernels()


@hookimpl
def splash_graph_ops(device):
    from .graphs import CudaGraphOps

    return CudaGraphOps(device)


@hookimpl
def splash_kda_kernels(device, dtype):
    from splash_core.kernels import fla_kda_kernels

    return fla_kda_kernels()  # None without fla-core: the reference's torch recurrence runs instead


@hookimpl
def splash_hardware_profile():
    if detect.unavailable_reason() is None and detect.sm(0) == "sm_100":
        return "b200"
    return None


@hookimpl
def splash_calibrate(collectives, device, options):
    return common.calibrate(collectives, device, options, splash_mla_kernels(device, options.get("dtype")))
