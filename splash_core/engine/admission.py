"""Admission by KV capacity (rank 0, before every step).

The KV pool gives every MLA layer ``pages`` pages on every rank. A set of requests fits a
layout when, on every rank, the pages its placement assigns there at the requests' reserved
lengths (prompt + output; :func:`splash_core.planning.costmodel.rank_loads`, the scheduler's Eq 6
accounting) are at most ``pages``: then the batch keeps fitting as it decodes, and
:meth:`~splash_core.runtime.model.Model.reserve` never runs out.

Admission is first come, first served. The head of the queue gets its owner from projected
KV growth (:func:`~splash_core.planning.ownership.assign_owner`) and is

- rejected, with the reason, when no layout the policy may run could hold it even alone;
- admitted when the running requests plus it fit the current layout;
- admitted when nothing runs and it fits another layout the policy may run (the engine then
  moves to a layout that holds it in its first step, feeding in that step only what the current
  layout holds: if the switch is refused, the step runs where it is, and the request ends
  rejected with the refusal, so no step ever runs out of pages:
  :class:`~splash_core.engine.controller.Controller`);
- otherwise left waiting, and so is everything behind it, until requests finish.

A scheduler decision to hold admission skips admission for the next step.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Sequence

import numpy as np

from ..layouts import LAYOUTS, Layout
from ..planning.costmodel import BatchArrays, rank_loads
from ..planning.ownership import assign_owner, pages_for
from .memory_plan import DeploymentMemory, deployment_memory, refusal
from .requests import Request


@dataclasses.dataclass(frozen=True)
class KVCapacity:
    """Pages per MLA layer on every rank, and where that number came from."""

    pages: int
    page_size: int
    T: int
    source: str  # how ``pages`` was chosen, in words

    def need(self, requests: Sequence[Request], owners: Sequence[int] | None = None,
             lengths: Sequence[int] | None = None) -> np.ndarray:
        """[len(LAYOUTS)]: the busiest rank's pages per layer for ``requests`` at their reserved
        lengths (or at ``lengths``: the pages they hold at those history lengths), in each layout
        (``owners`` overrides the requests' own)."""
        if not requests:
            return np.zeros(len(LAYOUTS), dtype=np.int64)
        tokens = [r.reserved_tokens for r in requests] if lengths is None else list(lengths)
        x = BatchArrays.of(tokens, [r.owner for r in requests] if owners is None else owners,
                           ids=[r.id for r in requests], reserved=tokens)
        return rank_loads(x, self.T, self.page_size).reserved_pages.max(axis=1).astype(np.int64)

    def fits(self, requests: Sequence[Request]) -> np.ndarray:
        """[len(LAYOUTS)] bools: which layouts hold ``requests``."""
        return self.need(requests) <= self.pages

    def rows_within(self, requests: Sequence[Request], rows: Sequence[int], layout: Layout) -> list[int]:
        """``rows`` (one step's rows of ``requests``) cut, in order, so that the histories after the
        step (fed + rows) fit ``layout``'s pool: what the step may feed where it runs in ``layout``
        if the switch it asks for is refused. A request may be left with no row."""
        at = LAYOUTS.index(layout)
        lengths = [r.fed for r in requests]
        out = []
        for k, (r, want) in enumerate(zip(requests, rows)):
            lo, hi = 0, int(want)  # the largest take that fits, by bisection (pages grow with it)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lengths[k] = r.fed + mid
                lo, hi = (mid, hi) if self.need(requests, lengths=lengths)[at] <= self.pages else (lo, mid - 1)
            lengths[k] = r.fed + lo
            out.append(lo)
        return out


def plan_capacity(deployment, concurrency: int, reserved_tokens: Iterable[int], pages: int | None = None,
                  layouts: Sequence[Layout] = LAYOUTS, memory: DeploymentMemory | None = None) -> KVCapacity:
    """Pages per layer per rank: ``pages`` when given; else what the memory left after the weights
    counted from their tensors (:func:`~splash_core.engine.memory_plan.deployment_memory`: weights as
    held, the graph pool, the reserve) buys on the tightest rank of any of ``layouts``, capped at
    what the workload can use (its ``concurrency`` largest requests, every page on every rank as
    in TP) so a small job does not allocate the whole budget. ``memory``: that plan where the caller
    already made it (for ``layouts`` or more), so the headers are not read twice."""
    T, page_size = deployment.T, deployment.page_size
    if pages is not None:
        if pages < 1:
            raise ValueError(f"the KV pool needs at least one page per layer (got {pages})")
        return KVCapacity(int(pages), page_size, T, "configured")
    largest = sorted((int(n) for n in pages_for(np.asarray(list(reserved_tokens)), page_size)), reverse=True)
    workload_pages = max(1, sum(largest[:concurrency]))
    if not deployment.kv_page_bytes:  # no MLA layer runs: the pool holds nothing
        return KVCapacity(workload_pages, page_size, T, "sized for the workload (no MLA layer)")
    memory = memory or deployment_memory(deployment, tuple(layouts))
    tightest = min((memory.of(layout) for layout in layouts), key=lambda m: m.kv_pages())
    budget_pages = tightest.kv_pages()
    if budget_pages < 1:
        raise ValueError(refusal(memory) or f"deployment {deployment.name!r}: no room for one KV page")
    if workload_pages <= budget_pages:
        return KVCapacity(workload_pages, page_size, T, f"sized for the workload; the memory budget holds {budget_pages:,}")
    return KVCapacity(budget_pages, page_size, T, f"the memory left after the weights ({memory.held}) in "
                                                  f"{tightest.layout}, rank {tightest.rank}")


class Admission:
    """First-come-first-served admission into the running set (rank 0)."""

    def __init__(self, capacity: KVCapacity, concurrency: int, layouts: Sequence[Layout]):
        self.capacity, self.concurrency = capacity, concurrency
        self.allowed = np.array([layout in layouts for layout in LAYOUTS])

    def admit(self, queue: collections.deque, running: list[Request], current: Layout, step: int) -> list[Request]:
        """Admit or reject from the head of ``queue`` (requests that have arrived); returns the
        requests whose state changed, in order. Admitted ones are appended to ``running``."""
        changed = []
        T = self.capacity.T
        projected = np.zeros(T, dtype=np.int64)
        for r in running:
            projected[r.owner] += r.reserved_tokens
        while queue and len(running) < self.concurrency:
            head = queue[0]
            owner = assign_owner(projected)
            reason = self.refusal(head, owner)
            if reason:
                queue.popleft().reject(reason)
                changed.append(head)
                continue
            fits = self.capacity.need(running + [head], [r.owner for r in running] + [owner]) <= self.capacity.pages
            if not (fits[LAYOUTS.index(current)] or (not running and (fits & self.allowed).any())):
                break
            queue.popleft().admit(owner, step)
            running.append(head)
            projected[owner] += head.reserved_tokens
            changed.append(head)
        return changed

    def refusal(self, request: Request, owner: int = 0) -> str:
        """Why no layout the policy may run could hold ``request`` even alone, or "" if one can
        (alone, its owner does not matter: every rank's pool is the same size)."""
        alone = self.capacity.need([request], [owner])
        return "" if (alone[self.allowed] <= self.capacity.pages).any() else self._too_long(request, alone)

    def _too_long(self, request: Request, alone: np.ndarray) -> str:
        per_layout = ", ".join(f"{n} in {layout}" for layout, n, ok in zip(LAYOUTS, alone.tolist(), self.allowed) if ok)
        return (f"{request.prompt_tokens} prompt + {request.spec.max_new_tokens} output tokens need more KV pages "
                f"per layer on one rank than the pool's {self.capacity.pages} ({self.capacity.page_size} tokens "
                f"each): {per_layout}")
