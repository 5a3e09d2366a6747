"""Hook bodies every NVIDIA backend shares (cuda answers with them; hopper reuses them so it
works even when the cuda plugin is filtered out by ``SPLASH_BACKENDS``)."""

from __future__ import annotations

import os

import torch

from splash_core.collectives import DistCollectives
from splash_core.device_streams import DeviceStreamOps

from . import detect


def device(local_rank: int) -> torch.device:
    """``cuda:local_rank``, made current (NCCL binds a communicator to the current device)."""
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RuntimeError(f"rank {local_rank} of this host needs a GPU of its own, but only {count} are visible")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def process_group_backend() -> str:
    # NVLink SHARP (multicast) stays off: it needs exclusive fabric set-up on shared hosts.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    return "nccl"


def side_group_options():
    """NCCL on a high-priority stream: the side communicator's kernels start on every rank as
    soon as processors free up, rather than behind the compute kernels queued before them
    (measured on 2 x H200, 16 layers at 64K, overhead of a switch into TP: 36 ms -> 23 ms,
    other directions within noise; bench/switch_trace.py, variant ncclpriority)."""
    import torch.distributed as dist

    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    return options


def collectives(group, device) -> DistCollectives:
    return DistCollectives(group, device)


def stream_ops(device) -> DeviceStreamOps:
    return DeviceStreamOps(torch.cuda, device)


def calibrate(collectives, device, options: dict, kernels) -> dict:
    """The core's measurement with this device's streams and kernels, plus its memory."""
    from splash_core.calibrate import measure

    theta = measure(collectives, device, stream_ops(device), kernels, options)
    theta["memory_gib"] = detect.total_memory_gib(device)
    return theta
