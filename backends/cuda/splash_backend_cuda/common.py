"""Hook bodies every NVIDIA backend shares (cuda answers with them; hopper reuses them so it
works even when the cuda plugin is filtered out by ``SPLASH_BACKENDS``)."""

from __future__ import annotations

import os
import warnings

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
    other directions within noise; bench/switch_trace.py, variant ncclpriority). And, where
    NCCL has it and ``copy_engines()`` allows, the zero-CTA policy: all-gathers between buffers
    in symmetric memory (:func:`collectives` with ``side``) then run on copy engines."""
    import torch.distributed as dist

    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    zero = getattr(dist.ProcessGroupNCCL, "NCCL_CTA_POLICY_ZERO", None)
    if zero is not None and copy_engines():
        options.config.cta_policy = zero
    return options


def copy_engines() -> bool:
    """Whether the side communicator moves all-gathers with copy engines where it can
    (``SPLASH_COPY_ENGINES=0`` turns it off, e.g. to compare). Measured on 2 x H200
    (bench/transport_probe.py): a layer's KV all-gather took 1.00 ms instead of 1.35 and slowed
    a matmul loop beside it about half as much per byte."""
    return os.environ.get("SPLASH_COPY_ENGINES", "1") != "0"


def collectives(group, device, side: bool = False) -> DistCollectives:
    """Collectives over ``group``; the side communicator's allocate their transfer buffers in
    NCCL symmetric memory and register them before each all-gather (when ``copy_engines()``
    and torch has it; otherwise, with a warning, plain buffers and processor-driven copies)."""
    if side and copy_engines():
        symmetric = _symmetric_memory(group, device)
        if symmetric is not None:
            return DistCollectives(group, device, transfer_memory=symmetric[0], register=symmetric[1])
    return DistCollectives(group, device)


def _symmetric_memory(group, device):
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
        pool = symm_mem.get_mem_pool(device)
    except Exception as exc:  # noqa: BLE001 - an older torch or NCCL: say so and go on without
        warnings.warn(f"side communicator without copy-engine all-gathers: {type(exc).__name__}: {exc}")
        return None
    name = group.group_name
    return (lambda: torch.cuda.use_mem_pool(pool)), (lambda t: symm_mem.rendezvous(t, group=name))


def stream_ops(device) -> DeviceStreamOps:
    return DeviceStreamOps(torch.cuda, device)


def calibrate(collectives, device, options: dict, kernels) -> dict:
    """The core's measurement with this device's streams and kernels, plus its memory."""
    from splash_core.calibrate import measure

    theta = measure(collectives, device, stream_ops(device), kernels, options)
    theta["memory_gib"] = detect.total_memory_gib(device)
    return theta
