"""Sets of (request, logical page) keys prepared once and applied to any layer's block tables
(:class:`~splash_core.runtime.block_tables.BlockTables`), and the error a full pool raises."""

from __future__ import annotations

import dataclasses

import numpy as np


class PoolFullError(RuntimeError):
    """Not enough free pages; raised before anything is written or allocated."""


@dataclasses.dataclass(frozen=True, eq=False)
class PageKeys:
    """Distinct (request, logical page) keys in a fixed order, prepared once so that a pool
    looks up, allocates or frees all of them with a few array operations (see :class:`LayerKV`).

    ``requests`` are the distinct request ids, ``slot[k]`` the index of key k's request among
    them, ``pages[k]`` its logical page, ``counts[j]`` how many keys request j has."""

    requests: tuple[int, ...]
    slot: np.ndarray  # [n] intp
    pages: np.ndarray  # [n] int64
    counts: np.ndarray  # [len(requests)] int64
    max_page: int  # -1 when there are no keys

    @classmethod
    def of(cls, keys) -> "PageKeys":
        """From ``keys`` [n, 2] (request, logical page); ValueError when a key repeats."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1, 2)
        rid, pages = keys[:, 0], np.ascontiguousarray(keys[:, 1])
        starts = np.concatenate([[0], np.flatnonzero(rid[1:] != rid[:-1]) + 1]) if len(keys) else np.zeros(0, np.int64)
        runs = rid[starts]
        rising = np.diff(pages) > 0
        rising[starts[1:] - 1] = True  # a run's first page follows another request's last
        if np.unique(runs).size == runs.size and rising.all():  # grouped by request, pages ascending (plans)
            counts = np.diff(np.append(starts, len(keys)))
            ids, slot = runs, np.repeat(np.arange(runs.size, dtype=np.intp), counts)
        else:
            ids, slot, counts = np.unique(rid, return_inverse=True, return_counts=True)
            slot = slot.reshape(-1).astype(np.intp)
            if np.unique(slot * (int(pages.max()) + 1) + pages).size != len(keys):
                raise ValueError("page keys repeat: each (request, page) may appear once")
        return cls(tuple(int(i) for i in ids), slot, pages, counts.astype(np.int64), int(pages.max(initial=-1)))

    @classmethod
    def one(cls, request: int, logical_pages) -> "PageKeys":
        """Keys of one request."""
        pages = np.asarray(logical_pages, dtype=np.int64).reshape(-1)
        if np.unique(pages).size != pages.size:
            raise ValueError(f"request {request}: logical pages repeat in {pages.tolist()}")
        return cls((int(request),), np.zeros(pages.size, np.intp), pages, np.array([pages.size], np.int64),
                   int(pages.max(initial=-1)))

    def __len__(self) -> int:
        return self.pages.size

    def placed(self, state: tuple) -> np.ndarray | None:
        """The physical pages last placed for these keys (-1: none was free), if that was in a
        pool in ``state`` (free pages, which requests hold rows, their rows): the layers of a
        model are usually in the same state, so a switch or a step places each key set once."""
        memo = self.__dict__.get("_placed")
        if memo is None or not all(np.array_equal(a, b) for a, b in zip(memo[0], state)):
            return None
        return memo[1]

    def remember_placed(self, state: tuple, physical: np.ndarray) -> None:
        object.__setattr__(self, "_placed", (state, physical.copy()))

    def by_request(self) -> np.ndarray | None:
        """The order that sorts the keys by request (as ``requests`` lists them), then page; None
        where they are in it already (as plans list them). Computed once."""
        if "_by_request" not in self.__dict__:
            rank = self.slot * (self.max_page + 1) + self.pages
            ordered = rank.size < 2 or bool((rank[1:] > rank[:-1]).all())
            object.__setattr__(self, "_by_request", None if ordered else np.argsort(rank, kind="stable"))
        return self.__dict__["_by_request"]

    def flat(self, rows: np.ndarray, width: int) -> np.ndarray:
        """Each key's index into a C-ordered table [*, width] whose row for ``requests[j]`` is
        ``rows[j]``. The last answer is kept: the layers of a model usually give their requests
        the same rows, so a switch computes it once for all of them."""
        memo = self.__dict__.get("_flat")
        tag = (rows.tobytes(), width)
        if memo is None or memo[0] != tag:
            memo = (tag, rows[self.slot] * width + self.pages)
            object.__setattr__(self, "_flat", memo)
        return memo[1]
