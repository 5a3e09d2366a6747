"""Small host arrays reaching the device: what every step sends (indices, block tables, token
ids, sampling draws) without making the host wait for the device."""

from __future__ import annotations

import numpy as np
import torch


def to_device(array: np.ndarray, device, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """A small host array (indices, tables) as a tensor on ``device`` without stalling the host:
    off the host it is staged in pinned memory and copied asynchronously on the current stream
    (torch's pinned-memory allocator keeps the staging buffer until that copy ran). A plain
    ``torch.as_tensor(array, device=...)`` would wait for every queued kernel first."""
    host = torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
    if torch.device(device).type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)
