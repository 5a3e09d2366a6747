"""What NVIDIA device torch sees, asked without creating a process group or compiling."""

from __future__ import annotations

import torch


def unavailable_reason() -> str | None:
    """None when torch can compute on an NVIDIA GPU here, else why not (one line)."""
    if getattr(torch.version, "hip", None):
        return f"torch is a ROCm/HIP build (HIP {torch.version.hip}), not CUDA; use the dcu backend"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} was built without CUDA"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "no CUDA device visible (torch.cuda.is_available() is False)"
    return None


def capability(index: int = 0) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def sm(index: int = 0) -> str:
    major, minor = capability(index)
    return f"sm_{major}{minor}"


def name(index: int = 0) -> str:
    return torch.cuda.get_device_name(index)


def processors(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def shared_memory(device) -> int:
    """Shared memory one program may opt into, bytes (0 if torch does not say)."""
    return int(getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0))


def total_memory_gib(device) -> float:
    return torch.cuda.get_device_properties(device).total_memory / (1 << 30)
