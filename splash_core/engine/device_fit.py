"""Whether a rank's device has the memory its deployment plans (a hardware profile of another
device would otherwise run out mid-load, or leave the collectives no room)."""

from __future__ import annotations

import torch

from ..profiles.deployment import DeploymentProfile


def device_memory(device) -> tuple[int, int] | None:
    """(free, total) bytes of an accelerator ``device``; None on the CPU or where torch cannot say."""
    where = torch.device(device)
    module = torch.get_device_module(where) if where.type != "cpu" else None
    return module.mem_get_info(where) if module is not None and hasattr(module, "mem_get_info") else None


def device_memory_problem(ctx, deployment: DeploymentProfile) -> str | None:
    """One line when the deployment plans more memory per rank than the rank's device has (a
    hardware profile of another device), to refuse before anything is loaded; else None."""
    held = device_memory(ctx.device)
    if held is not None and deployment.memory_budget_bytes > held[1]:
        gib = 1 << 30
        return (f"rank {ctx.rank}: deployment {deployment.name!r} plans {deployment.memory_budget_bytes / gib:.2f} GiB "
                f"per rank (hardware {deployment.hardware.name!r}: {deployment.hardware.memory_bytes / gib:.2f} GiB x "
                f"memory_fraction {deployment.memory_fraction:g}), but {ctx.device} has {held[1] / gib:.2f} GiB; use "
                f"this device's hardware profile or a smaller memory_fraction")
    return None
