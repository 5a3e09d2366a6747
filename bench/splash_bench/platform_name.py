"""The results folder of a benchmark that drives ``splash`` as a user would (no rank in this
process to ask): the accelerator's model name as the driver reports it, so an H100 run is never
filed under h200."""

from __future__ import annotations

import re
import shutil
import subprocess

MIN_HEADROOM_GIB = 8.0  # an H200 run at fraction 0.95 left 7 GiB; an H100 one at 4 GiB ran out in NCCL
KNOWN = ("b200", "h200", "h100", "a100", "mi300", "bw1000")


def accelerator_platform(default: str = "cpu") -> str:
    """``h100``, ``h200``... for the first GPU ``nvidia-smi`` lists (no CUDA context is made in
    this process, which would take memory from the server it measures); ``default`` where there
    is none."""
    if shutil.which("nvidia-smi") is None:
        return default
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    name = done.stdout.splitlines()[0].lower() if done.returncode == 0 and done.stdout.strip() else ""
    for known in KNOWN:
        if known in name:
            return known
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or default


def accelerator_memory_gib() -> float | None:
    """Total memory of the first GPU ``nvidia-smi`` lists, GiB (None: none)."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True)
    try:
        return float(done.stdout.splitlines()[0]) / 1024
    except (ValueError, IndexError):
        return None


def device_memory_fraction(fraction: float, hardware_memory_gib: float) -> float:
    """``fraction`` of a hardware profile's memory, scaled down to this machine's GPU when it has
    less (a benchmark written for an H200 profile run on an H100 would plan memory it lacks),
    keeping the same headroom in GiB that ``fraction`` leaves on the profile's device (the CUDA
    context, the collectives' buffers and the allocator's slack do not shrink with the device)."""
    device = accelerator_memory_gib()
    if device is None or device >= hardware_memory_gib:
        return fraction
    headroom = max((1 - fraction) * hardware_memory_gib, MIN_HEADROOM_GIB)
    return round(max(device - headroom, 0.0) / hardware_memory_gib, 4)
