"""How the expanded form's rows and keys (contract: :mod:`.expanded`) become calls of a dense
attention (torch's scaled_dot_product_attention family, :mod:`.expanded_sdpa`): pure, on the host.

A dense kernel knows one causal shape only, the square one (row i sees keys 0..i), so a request
goes to it split in two parts that are merged by log-sum-exp afterwards:

- ``history``: its keys before its first row's position, seen by every row (no mask);
- ``chunk``: its keys at its rows' own positions, in position order, one per row (a square causal
  block). Keys after its last row are seen by no row and left out.

That is every request as serving gives it (a chunk after its cached history; the unwritten slots
of its last page come after its last row), also where the runtime's passes hold only part of the
chunk's keys (:func:`_pieces`). A request whose keys between its first and last row are anything
else (a context-parallel rank holding some of the chunk's pages, repeated positions, rows with
gaps) goes to the fallback kernel, whole. Requests whose parts have equal
sizes form one batched call when ``group`` is on.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class DenseGroup:
    """Requests whose dense parts have equal sizes: one batched call per part."""

    rows: np.ndarray  # [B, n] int64: query rows, each request's in position order
    history: np.ndarray  # [B, h] int64: keys every row of the request sees (h may be 0)
    chunk: np.ndarray  # [B, n] or [B, 0] int64: keys at the rows' positions, in position order


@dataclasses.dataclass(frozen=True)
class DensePlan:
    groups: tuple[DenseGroup, ...]
    fallback_rows: np.ndarray  # [*] int64: rows of requests the dense parts cannot express
    empty_rows: np.ndarray  # [*] int64: rows that see no key (out 0, lse -inf)


def _pieces(rows: np.ndarray, q_pos: np.ndarray, keys: np.ndarray, k_pos: np.ndarray) -> list[tuple] | None:
    """``[(rows, history, chunk)]`` of one request's rows (sorted by position) over its ``keys``, or
    None where no dense calls express it. Where the keys at row positions cover only a run of the
    rows (the runtime splits long histories into passes), the rows before that run see the history
    alone and the rows after it see the run as more history."""
    first, last = q_pos[rows[0]], q_pos[rows[-1]]
    if rows.size > 1 and np.any(np.diff(q_pos[rows]) <= 0):
        return None  # a square causal block has one key per row, at that row's own position
    positions = k_pos[keys]
    history = keys[positions < first]
    inside = (positions >= first) & (positions <= last)
    chunk = keys[inside][np.argsort(positions[inside], kind="stable")]
    if chunk.size == 0:
        return [(rows, history, chunk)]
    a = int(np.searchsorted(q_pos[rows], k_pos[chunk[0]]))
    b = a + chunk.size
    if b > rows.size or not np.array_equal(k_pos[chunk], q_pos[rows[a:b]]):
        return None
    none = chunk[:0]
    pieces = [(rows[:a], history, none), (rows[a:b], history, chunk),
              (rows[b:], np.concatenate([history, chunk]), none)]
    return [p for p in pieces if p[0].size]


def plan(q_req: np.ndarray, q_pos: np.ndarray, k_start: np.ndarray, k_pos: np.ndarray,
         group: bool = True) -> DensePlan:
    """The dense calls for rows ``q_req``/``q_pos`` over keys ``k_start``/``k_pos`` (host int arrays)."""
    q_req, q_pos, k_start, k_pos = (np.asarray(a, dtype=np.int64) for a in (q_req, q_pos, k_start, k_pos))
    order = np.lexsort((q_pos, q_req))
    requests, begins = np.unique(q_req[order], return_index=True)
    ends = np.append(begins[1:], order.size)
    parts: dict[tuple, list] = {}
    fallback, empty = [], []
    for r, b, e in zip(requests.tolist(), begins.tolist(), ends.tolist()):
        pieces = _pieces(order[b:e], q_pos, np.arange(k_start[r], k_start[r + 1]), k_pos)
        if pieces is None:
            fallback.append(order[b:e])
        for i, (rows, history, chunk) in enumerate(pieces or ()):
            if history.size == 0 and chunk.size == 0:
                empty.append(rows)
            else:
                shape = (rows.size, history.size, chunk.size) if group else (r, i)
                parts.setdefault(shape, []).append((rows, history, chunk))
    groups = tuple(DenseGroup(*(np.stack([p[i] for p in members]) for i in range(3))) for members in parts.values())
    flat = lambda chunks: np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)  # noqa: E731
    return DensePlan(groups, flat(fallback), flat(empty))


def affine(index: np.ndarray) -> tuple[int, int] | None:
    """``(first, step)`` where ``index[b, j] == first + b * step + j`` (rows of consecutive
    entries, equally spaced: a strided view reads them without a copy), else None."""
    if index.size == 0 or (index.shape[1] > 1 and not np.all(np.diff(index, axis=1) == 1)):
        return None if index.size else (0, 0)
    starts = index[:, 0]
    step = int(starts[1] - starts[0]) if starts.size > 1 else index.shape[1]
    if starts.size > 1 and (step < 0 or not np.all(np.diff(starts) == step)):
        return None
    return int(starts[0]), step


@dataclasses.dataclass(frozen=True, eq=False)
class HostIndex:
    """The index arguments of an expanded call (``q_req, q_pos, k_start, k_pos``) as host arrays,
    made by a caller that already has them (the runtime), so a provider that plans on the host
    copies nothing back from the device; ``memo`` keeps its plans while the caller keeps it (every
    layer of a step with equal keys)."""

    q_req: np.ndarray
    q_pos: np.ndarray
    k_start: np.ndarray
    k_pos: np.ndarray
    _memo: dict = dataclasses.field(default_factory=dict, repr=False)

    def memo(self, key, build):
        """``build()`` once per ``key`` for this index."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]


def call_expanded(kernel, host: HostIndex | None, *args):
    """``kernel(*args)`` (the contract's arguments), handing it ``host`` where it takes one
    (``takes_host_index``: the providers that plan on the host)."""
    if host is not None and getattr(kernel, "takes_host_index", False):
        return kernel(*args, host=host)
    return kernel(*args)
