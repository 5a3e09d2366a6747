"""Shape buckets for the dense calls of :mod:`.expanded_plan`: the same attention, computed by calls
whose shapes come from a small fixed set, so a kernel that builds a graph per shape (torch's cuDNN
attention: 57-950 ms a new shape on an H100) builds few over a long run. Pure, on the host.

Every bucketed call is exact (the same function, no approximation):

- history: its first ``G * (h // G)`` keys (``G``: :attr:`BucketSizes.granularity`) are cut into
  pieces of ``G * 2^k`` keys, at most one of each size (the binary decomposition of ``h // G``),
  each a call without mask; the log-sum-exp merge joins them. Queries are padded at the end to a
  row bucket (their outputs dropped): extra queries change no real row's result.
- chunk: a square causal call whose first ``r = h mod G`` keys are the history's remaining keys
  and whose first ``r`` query slots are padding (top-left causal: real row i, at slot ``r + i``,
  sees the ``r`` history keys and the chunk's keys up to its own), padded at the end to a row
  bucket in both queries and keys (real rows never see keys after them).
- a request's rows that see history alone (a pass of the runtime's holding none of their chunk)
  with ``h mod G`` left over: the rest goes to one call of exactly those keys (no mask, so no
  padding is exact). The runtime cuts its passes at multiples of ``G`` so that on TP it does not
  arise; a context-parallel rank's share of a history (any number of pages) can leave one.
- a group of B equal requests: sub-batches of 2^k requests (the binary decomposition of B).

The callers copy each call's operands into contiguous buffers of the bucket's shape, so strides
(part of the graph's key) follow from the shape.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .expanded_plan import DenseGroup, DensePlan


@dataclasses.dataclass(frozen=True)
class BucketSizes:
    """History pieces: ``granularity * 2^k`` keys; row buckets: powers of two from ``smallest_rows``
    to ``row_step``, then multiples of ``row_step``. A finer ``row_step`` pads less and builds more
    shapes (a simulated rollout, ``tests/test_expanded_buckets.py``: 1,024 gives 11-28% extra work
    over 24-66 shapes, 512 gives 6-14% over 35-105)."""

    granularity: int = 1024
    smallest_rows: int = 128
    row_step: int = 512

    def __post_init__(self):
        for name in ("granularity", "smallest_rows", "row_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"BucketSizes.{name} must be a positive power of two, got {value!r}")
        if self.smallest_rows > self.row_step:
            raise ValueError(f"BucketSizes.smallest_rows {self.smallest_rows} exceeds row_step {self.row_step}")

    def rows(self, n: int) -> int:
        """The bucket of ``n`` query rows (or square causal slots)."""
        if n <= self.row_step:
            return max(self.smallest_rows, 1 << max(0, n - 1).bit_length())
        return -(-n // self.row_step) * self.row_step

    def ladder(self, most: int) -> list[int]:
        """Every row bucket up to that of ``most`` rows, ascending."""
        top, out, size = self.rows(most), [], self.smallest_rows
        while size <= top:
            out.append(size)
            size = size * 2 if size < self.row_step else size + self.row_step
        return out

    def history_pieces(self, h: int) -> tuple[list[int], int]:
        """(piece sizes, largest first, summing to ``h - h mod G``; the remainder ``h mod G``)."""
        whole, rest = divmod(h, self.granularity)
        return [self.granularity << k for k in reversed(range(whole.bit_length())) if whole >> k & 1], rest


@dataclasses.dataclass(frozen=True)
class BucketCall:
    """One dense call: the group's query rows at query slots ``front .. front + n - 1`` of
    ``q_len`` (the rest zero padding), ``keys`` at key slots ``0 .. k - 1`` of ``k_len``."""

    keys: np.ndarray  # [b, k] int64
    front: int
    q_len: int
    k_len: int
    causal: bool

    def shape(self) -> tuple[int, int, int, bool]:
        """(batch, query slots, key slots, causal): what a graph-building kernel keys on, with the
        head count and widths every call of a layer shares."""
        return self.keys.shape[0], self.q_len, self.k_len, self.causal

    def pairs(self) -> int:
        """(query, key) pairs the kernel computes, padding included (a causal call: its triangle)."""
        return self.keys.shape[0] * (self.q_len * (self.q_len + 1) // 2 if self.causal else self.q_len * self.k_len)


@dataclasses.dataclass(frozen=True)
class BucketGroup:
    rows: np.ndarray  # [b, n] int64: query rows, as in :class:`DenseGroup`
    calls: tuple[BucketCall, ...]  # merged by log-sum-exp; every real row sees a key in each


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    groups: tuple[BucketGroup, ...]
    fallback_rows: np.ndarray
    empty_rows: np.ndarray

    def shapes(self) -> set[tuple[int, int, int, bool]]:
        return {c.shape() for g in self.groups for c in g.calls}


def binary_batches(batch: int) -> list[tuple[int, int]]:
    """(first, size) of sub-batches of ``batch`` requests, sizes distinct powers of two, largest first."""
    out, first = [], 0
    for k in reversed(range(batch.bit_length())):
        if batch >> k & 1:
            out.append((first, 1 << k))
            first += 1 << k
    return out


def _calls(history: np.ndarray, chunk: np.ndarray, n: int, sizes: BucketSizes) -> tuple[BucketCall, ...]:
    pieces, rest = sizes.history_pieces(history.shape[1])
    calls, start, q_len = [], 0, sizes.rows(n)
    for size in pieces:
        calls.append(BucketCall(history[:, start:start + size], 0, q_len, size, False))
        start += size
    tail = history[:, start:]
    if chunk.shape[1]:
        slots = sizes.rows(rest + n)
        calls.append(BucketCall(np.concatenate([tail, chunk], axis=1), rest, slots, slots, True))
    elif rest:  # history alone, keys not a multiple of G: no exact padding without a mask
        calls.append(BucketCall(tail, 0, q_len, rest, False))
    return tuple(calls)


def _bucket_group(g: DenseGroup, sizes: BucketSizes) -> list[BucketGroup]:
    return [BucketGroup(g.rows[a:a + b], _calls(g.history[a:a + b], g.chunk[a:a + b], g.rows.shape[1], sizes))
            for a, b in binary_batches(g.rows.shape[0])]


def bucket(plan: DensePlan, sizes: BucketSizes) -> BucketPlan:
    """``plan``'s dense calls as calls of bucketed shapes (fallback and empty rows as in ``plan``)."""
    groups = tuple(b for g in plan.groups for b in _bucket_group(g, sizes))
    return BucketPlan(groups, plan.fallback_rows, plan.empty_rows)


def deployment_shapes(sizes: BucketSizes, max_rows: int, max_context: int,
                      max_batch: int = 1) -> list[tuple[int, int, int, bool]]:
    """Every bucketed call shape (:meth:`BucketCall.shape`) of requests of at most ``max_rows``
    rows in a call and ``max_context`` keys, in groups of up to ``max_batch`` equal requests (no
    history-alone remainder calls: the runtime's passes do not produce them)."""
    shapes, b = set(), 1
    while b <= max_batch:
        n_most = max(1, min(max_rows // b, max_context))
        shapes.update((b, s, s, True) for s in sizes.ladder(min(n_most + sizes.granularity - 1, max_context)))
        piece = sizes.granularity
        while piece < max_context:  # a piece of history leaves room for a row
            shapes.update((b, q, piece, False) for q in sizes.ladder(min(n_most, max_context - piece)))
            piece *= 2
        b *= 2
    return sorted(shapes)
