"""Hook implementations of the ROCm/HIP backend (entry point ``splash = dcu``).

RCCL through torch.distributed (ROCm builds answer to the ``"nccl"`` backend name with
RCCL), HIP streams and events through ``torch.cuda``, the portable Triton MLA kernels with
64 KiB-LDS tiles, and the paper-derived ``dcu-bw1000`` profile on BW1000.
"""

from __future__ import annotations

import torch

from splash_core.platform.collectives import DistCollectives
from splash_core.platform.device_streams import DeviceStreamOps
from splash_core.platform.hookspecs import hookimpl
from splash_core.platform.interfaces import BackendInfo

from . import __version__, configs, detect, formats


@hookimpl
def splash_backend_info():
    return BackendInfo(
        name="dcu",
        version=__version__,
        summary="ROCm/HIP (Hygon DCU, AMD Instinct): RCCL, 64 KiB-LDS Triton MLA tiles, FP8 KV where supported",
        device_type="cuda",  # torch's device type for HIP devices
        accelerator=True,
    )


@hookimpl
def splash_backend_check():
    return detect.unavailable_reason()


@hookimpl
def splash_device(local_rank):
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RuntimeError(f"rank {local_rank} of this host needs a device of its own, but only {count} are visible")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


@hookimpl
def splash_process_group_backend():
    return "nccl"  # RCCL on ROCm builds of torch


@hookimpl
def splash_make_collectives(group, device):
    return DistCollectives(group, device)


@hookimpl
def splash_stream_ops(device):
    return DeviceStreamOps(torch.cuda, device)


def kernel_config(device):
    return configs.config_for(detect.arch(device.index or 0), detect.processors(device))


@hookimpl
def splash_mla_kernels(device, dtype):
    from splash_core.kernels import triton_mla_kernels

    return triton_mla_kernels(kernel_config(device))


@hookimpl
def splash_kda_kernels(device, dtype):
    from splash_core.kernels import fla_kda_kernels

    return fla_kda_kernels()  # fla's Triton kernels support ROCm; None falls back to the reference


@hookimpl
def splash_hardware_profile():
    if detect.unavailable_reason() is None and "BW1000" in detect.name(0):
        return "dcu-bw1000"
    return None


@hookimpl
def splash_calibrate(collectives, device, options):
    from splash_core.studies.calibrate import measure

    theta = measure(collectives, device, splash_stream_ops(device), splash_mla_kernels(device, options.get("dtype")),
                    options)
    theta["memory_gib"] = detect.total_memory_gib(device)
    return theta


def supported_formats(index: int = 0) -> formats.Formats:
    """Weight and KV formats of device ``index`` (for deployment checks and ``--help`` text)."""
    return formats.formats_for(detect.arch(index), detect.name(index))
