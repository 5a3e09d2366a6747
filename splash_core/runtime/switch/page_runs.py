"""Pages that lie next to each other in the pool, copied as one block (``Tensor.copy_``, a
device-to-device memcpy, which accelerators run on copy engines rather than processors).

A switch's pages are mostly such runs: a request's pages are allocated together. Packing a run
into a transfer buffer, or unpacking it into the pool, is then one memcpy instead of a share of
a copy kernel's programs, which would compete with the step's attention for processors.
"""

from __future__ import annotations

import numpy as np
import torch


def runs(pages: np.ndarray) -> np.ndarray:
    """[k, 3] int64: (first page, first row, length) of each run of consecutive ``pages``."""
    pages = np.asarray(pages, dtype=np.int64)
    if len(pages) == 0:
        return np.zeros((0, 3), dtype=np.int64)
    cuts = np.flatnonzero(np.diff(pages) != 1) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(pages)]])
    return np.stack([pages[starts], starts, ends - starts], axis=1)


def gather(cache: torch.Tensor, page_runs: np.ndarray, out: torch.Tensor) -> torch.Tensor:
    """Rows ``row .. row + n`` of ``out`` get pages ``page .. page + n`` of ``cache`` per run; ``out``."""
    for page, row, n in page_runs.tolist():
        out[row: row + n].copy_(cache[page: page + n])
    return out


def scatter(cache: torch.Tensor, page_runs: np.ndarray, buf: torch.Tensor) -> None:
    """Pages ``page .. page + n`` of ``cache`` get rows ``row .. row + n`` of ``buf`` per run."""
    for page, row, n in page_runs.tolist():
        cache[page: page + n].copy_(buf[row: row + n])
