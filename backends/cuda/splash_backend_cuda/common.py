"""Hook bodies every NVIDIA backend shares (cuda answers with them; hopper reuses them so it
works even when the cuda plugin is filtered out by ``SPLASH_BACKENDS``)."""

from __future__ import annotations

import os
import warnings

import torch

from splash_core.platform.collectives import DistCollectives, TransferBuffers
from splash_core.platform.device_streams import DeviceStreamOps

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


def side_group_options(transfer):
    """NCCL on a high-priority stream: the side communicator's kernels start on every rank as
    soon as processors free up, rather than behind the compute kernels queued before them
    (measured on 2 x H200, 16 layers at 64K, overhead of a switch into TP: 36 ms -> 23 ms,
    other directions within noise; bench/switch_trace.py, variant ncclpriority). And, where
    NCCL has it and ``transfer.copy_engines`` allows, the zero-CTA policy: all-gathers between
    buffers in symmetric memory (:func:`collectives` for the side communicator) then run on
    copy engines.

    Copy engines, measured on 2 x H200, 16 layers at 64K (bench/results/h200x2/switch_trace-0fb9a43.json at git 148a7b0,
    median of 5 untraced runs): with the movers gathering in place (pages packed straight into
    the buffer, and at T = 2 the KV all-to-alls as all-gathers), a switch's overhead into TP fell
    from 25.7 to 13.8 ms, DOP→CP 27.3 -> 16.7, CP→DOP 10.7 -> 9.6, TP→DP 4.8 -> 5.3 (noise),
    because attention no longer loses processors to NCCL's kernels beside it."""
    import torch.distributed as dist

    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    zero = getattr(dist.ProcessGroupNCCL, "NCCL_CTA_POLICY_ZERO", None)
    if zero is not None and transfer.copy_engines:
        options.config.cta_policy = zero
    return options


def collectives(group, device, side: bool = False, transfer=None) -> DistCollectives:
    """Collectives over ``group``. The side communicator's gather in NCCL symmetric memory
    where ``transfer.copy_engines`` (with a warning, in plain memory where this torch has no
    NCCL symmetric memory)."""
    if side and transfer is not None and transfer.copy_engines:
        allocate = _symmetric_allocator(group, device)
        if allocate is not None:
            return DistCollectives(group, device, transfer_buffers=TransferBuffers(allocate))
    return DistCollectives(group, device)


def _symmetric_allocator(group, device):
    """``nbytes -> uint8 tensor`` in NCCL symmetric memory registered with ``group`` (each call
    is a collective), or None when this torch cannot."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
    except Exception as exc:  # noqa: BLE001 - an older torch: say so and go on without
        warnings.warn(f"side communicator without copy-engine all-gathers: {type(exc).__name__}: {exc}")
        return None
    name = group.group_name

    def allocate(nbytes: int) -> torch.Tensor:
        buf = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(buf, group=name)
        return buf

    return allocate


def stream_ops(device) -> DeviceStreamOps:
    return DeviceStreamOps(torch.cuda, device)


def calibrate(collectives, device, options: dict, kernels) -> dict:
    """The core's measurement with this device's streams and kernels, plus its memory."""
    from splash_core.studies.calibrate import measure

    theta = measure(collectives, device, stream_ops(device), kernels, options)
    theta["memory_gib"] = detect.total_memory_gib(device)
    return theta
