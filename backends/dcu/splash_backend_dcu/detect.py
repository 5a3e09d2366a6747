"""What ROCm/HIP device torch sees. ROCm builds of torch expose HIP devices through the
``torch.cuda`` module and the ``"cuda"`` device type, and report ``torch.version.hip``."""

from __future__ import annotations

import torch


def unavailable_reason() -> str | None:
    """None when torch can compute on a HIP device here, else why not (one line)."""
    if not getattr(torch.version, "hip", None):
        return f"torch {torch.__version__} is not a ROCm/HIP build (torch.version.hip is None)"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return f"no HIP device visible (ROCm {torch.version.hip})"
    return None


def arch(index: int = 0) -> str:
    """The gfx architecture without feature flags: ``gfx942:sramecc+:xnack-`` -> ``gfx942``."""
    return str(getattr(torch.cuda.get_device_properties(index), "gcnArchName", "unknown")).split(":")[0]


def name(index: int = 0) -> str:
    return torch.cuda.get_device_name(index)


def processors(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def total_memory_gib(device) -> float:
    return torch.cuda.get_device_properties(device).total_memory / (1 << 30)
