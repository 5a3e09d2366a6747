"""The metadata of one serving step, computed identically on every rank (docs/design.md §3 step 1).

A :class:`StepBatch` lists the running requests of a step, each with its owner, the tokens
already in its history (``start``) and the query rows it feeds this step (``rows``: the
prefill chunk, or 1 in decode). Rows are ordered owner-major (all rows of rank 0's requests,
then rank 1's ...; requests of one owner keep their given order), so every owner's rows are
one contiguous slice and the variable-size exchanges of DP, DOP and CP need no extra
metadata: split sizes come from :attr:`owner_rows`, which every rank already knows.

Everything here is plain numpy and pure; the runtime turns the index arrays it needs into
device tensors once per step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterable, Sequence

import numpy as np

from ..layouts import Layout, Ownership
from ..planning import ownership


@dataclasses.dataclass(frozen=True)
class StepRequest:
    """One request in a step."""

    id: int  # stable, unique in the group (CP places page p of request id on (p + id) mod T)
    owner: int  # owner rank, chosen at admission (ownership.assign_owners), whatever the layout
    start: int  # tokens already in its history before this step
    rows: int  # query rows fed this step (>= 1)


@dataclasses.dataclass(frozen=True)
class StepBatch:
    """The requests of one step, in owner-major order, for a group of ``T`` ranks."""

    requests: tuple[StepRequest, ...]
    T: int
    page_size: int

    @classmethod
    def build(cls, requests: Iterable[StepRequest | Sequence[int]], T: int, page_size: int) -> "StepBatch":
        """Validate and order requests owner-major; each entry is a StepRequest or (id, owner, start, rows)."""
        reqs = [r if isinstance(r, StepRequest) else StepRequest(*map(int, r)) for r in requests]
        if not reqs:
            raise ValueError("a step needs at least one request")
        ids = [r.id for r in reqs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"request ids must be unique in a step (got {ids})")
        for r in reqs:
            if not 0 <= r.owner < T:
                raise ValueError(f"request {r.id}: owner {r.owner} is not a rank of a group of {T}")
            if r.start < 0 or r.rows < 1:
                raise ValueError(f"request {r.id}: needs start >= 0 and rows >= 1 (got {r.start}, {r.rows})")
        if page_size < 1:
            raise ValueError(f"page_size must be positive (got {page_size})")
        ordered = sorted(reqs, key=lambda r: r.owner)  # stable: admission order within an owner
        return cls(tuple(ordered), int(T), int(page_size))

    # ---- per request --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.requests)

    @functools.cached_property
    def ids(self) -> np.ndarray:
        return np.array([r.id for r in self.requests], dtype=np.int64)

    @functools.cached_property
    def owners(self) -> np.ndarray:
        return np.array([r.owner for r in self.requests], dtype=np.int64)

    @functools.cached_property
    def starts(self) -> np.ndarray:
        return np.array([r.start for r in self.requests], dtype=np.int64)

    @functools.cached_property
    def rows(self) -> np.ndarray:
        return np.array([r.rows for r in self.requests], dtype=np.int64)

    @property
    def contexts(self) -> np.ndarray:
        """s_i after this step: history including this step's rows."""
        return self.starts + self.rows

    @functools.cached_property
    def is_decode(self) -> bool:
        """One row per request (the kernels' decode path applies)."""
        return bool((self.rows == 1).all())

    def ownership_batch(self) -> ownership.Batch:
        """The batch as the ownership model sees it after this step (contexts include the rows)."""
        return ownership.Batch(tuple(
            ownership.Request(int(i), int(c), int(o), int(q))
            for i, c, o, q in zip(self.ids, self.contexts, self.owners, self.rows)))

    # ---- per row -------------------------------------------------------------------------

    @functools.cached_property
    def num_rows(self) -> int:
        return int(self.rows.sum())

    @functools.cached_property
    def row_offsets(self) -> np.ndarray:
        """[R + 1]: rows of request i are ``row_offsets[i]:row_offsets[i + 1]``."""
        return np.concatenate([[0], np.cumsum(self.rows)])

    @functools.cached_property
    def row_request(self) -> np.ndarray:
        """[N]: index (into ``requests``) of each row's request."""
        return np.repeat(np.arange(len(self)), self.rows)

    @functools.cached_property
    def row_positions(self) -> np.ndarray:
        """[N]: absolute position of each row in its request's history."""
        within = np.arange(self.num_rows) - self.row_offsets[self.row_request]
        return self.starts[self.row_request] + within

    @functools.cached_property
    def last_rows(self) -> np.ndarray:
        """[R]: each request's last row (the one whose logits predict its next token)."""
        return self.row_offsets[1:] - 1

    # ---- per owner -----------------------------------------------------------------------

    @functools.cached_property
    def owner_rows(self) -> np.ndarray:
        """[T]: query rows owned by each rank (split sizes of the DP/DOP/CP exchanges)."""
        out = np.zeros(self.T, dtype=np.int64)
        np.add.at(out, self.owners, self.rows)
        return out

    @functools.cached_property
    def owner_row_offsets(self) -> np.ndarray:
        """[T + 1]: rows of rank r are ``owner_row_offsets[r]:owner_row_offsets[r + 1]``."""
        return np.concatenate([[0], np.cumsum(self.owner_rows)])

    def owned_requests(self, rank: int) -> np.ndarray:
        """Indices (into ``requests``) of the requests ``rank`` owns, in order."""
        return np.flatnonzero(self.owners == rank)

    def owned_row_slice(self, rank: int) -> slice:
        return slice(int(self.owner_row_offsets[rank]), int(self.owner_row_offsets[rank + 1]))

    # ---- pages ---------------------------------------------------------------------------

    @functools.cached_property
    def row_pages(self) -> np.ndarray:
        """[N]: logical page of each row's token."""
        return self.row_positions // self.page_size

    def page_holder_rows(self, layout: Layout, rank: int) -> np.ndarray:
        """Rows whose new token ``rank`` stores in a layer of ``layout`` (ownership rules)."""
        if layout.ownership is Ownership.ALL:
            return np.arange(self.num_rows)
        if layout.ownership is Ownership.OWNER:
            return np.arange(*self.owned_row_slice(rank).indices(self.num_rows))
        ids = self.ids[self.row_request]
        return np.flatnonzero(ownership.cp_rank_of_page(ids, self.row_pages, self.T) == rank)

    def new_pages(self) -> tuple[np.ndarray, np.ndarray]:
        """[R] first and end (exclusive) logical page each request opens this step."""
        first = ownership.pages_for(self.starts, self.page_size)
        end = ownership.pages_for(self.contexts, self.page_size)
        return first, end

    @property
    def opens_pages(self) -> bool:
        """Whether any request crosses into a new page this step (then pools must allocate)."""
        first, end = self.new_pages()
        return bool((end > first).any())
