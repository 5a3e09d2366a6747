"""The uniform numbers sampled outputs are chosen at: drawn on rank 0 when it plans a step, from
``(seed, request id, output index)`` (or ``(seed, output index)`` for a request whose seed stands
alone, as an API's ``seed`` promises the same tokens in any request), so any output's draw can be
recomputed alone and the reference check replays it exactly. Every rank then chooses the token on
its device (:mod:`splash_core.runtime.sampling`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..runtime.sampling import SamplingParams


def uniform(params: SamplingParams, request_id: int, index: int) -> float:
    """The uniform draw of output ``index`` of request ``request_id``."""
    return float(uniforms([params], [request_id], [index])[0])


def uniforms(params: Sequence[SamplingParams], request_ids: Sequence[int], indexes: Sequence[int]) -> np.ndarray:
    """Each row's :func:`uniform` at once, in [0, 1): a counter-based hash (SplitMix64's mixer)
    of (seed, request id, output index), so planning a step of many sampled rows costs
    microseconds and any output's draw can be recomputed alone."""
    h = _mix(_u64([p.seed for p in params]) ^ np.uint64(0x9E3779B97F4A7C15))
    alone = np.array([p.seed_alone for p in params], dtype=bool)
    h = np.where(alone, h, _mix(h ^ _u64(request_ids)))
    h = _mix(h ^ _u64(indexes) ^ np.uint64(0xD1B54A32D192ED03))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _u64(values) -> np.ndarray:
    """Python integers (any sign or size) as uint64, modulo 2^64."""
    return np.array([v % (1 << 64) for v in values], dtype=np.uint64)


def _mix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as the mixer intends
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
