"""The Hopper kernel config, read from data: ``tuned/h200.json``.

The file holds an :class:`~splash_core.kernels.MLAKernelConfig` (tiles, and rules choosing
tiles by head count) and where it came from. ``bench/gpu_kernels.py --sections sweep``
measures candidate tiles on an H200 and writes a new file (``source: measured``, with date,
machine, command and the timings); copying it here makes it the backend's config. Until
then the file says ``source: default``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from splash_core.kernels import MLAKernelConfig

TUNED = Path(__file__).with_name("tuned") / "h200.json"


@functools.lru_cache(maxsize=None)
def load(path: str | Path = TUNED) -> tuple[MLAKernelConfig, dict]:
    """(config, provenance) from a tuned-config file; errors name the file."""
    try:
        data = json.loads(Path(path).read_text())
        return MLAKernelConfig.from_dict(data["config"]), {k: v for k, v in data.items() if k != "config"}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a tuned kernel config: {exc}") from None
