"""A minimal serving loop: chunked prefill, then greedy decode, for any ``step(batch, tokens)``.

Used by the equivalence tests and the GPU benchmark to drive the distributed
:class:`~splash_core.runtime.model.Model` and the single-process
:class:`~splash_core.runtime.reference_model.ReferenceModel` through the same steps. Each step
feeds every unfinished request either its next prompt chunk (up to ``chunk`` rows) or its last
generated token, so prompts of unequal length give steps that mix prefill and decode rows.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from splash_core.runtime.step_batch import StepBatch, StepRequest


@dataclasses.dataclass(frozen=True)
class Prompt:
    """A request to serve: its id, owner rank and prompt tokens."""

    id: int
    owner: int
    tokens: tuple[int, ...]


@dataclasses.dataclass
class Generation:
    """What a run produced: per step the request ids and their logits, and each request's tokens."""

    steps: list[tuple[tuple[int, ...], np.ndarray]]
    tokens: dict[int, list[int]]


def generate(step: Callable[[StepBatch, torch.Tensor], torch.Tensor], prompts: Sequence[Prompt], *, T: int,
             page_size: int, chunk: int, new_tokens: int, release: Callable[[int], None] | None = None,
             forced: Mapping[int, Sequence[int]] | None = None) -> Generation:
    """Serve ``prompts`` until each has ``new_tokens`` generated tokens.

    ``forced`` (request id -> tokens) feeds those tokens instead of the greedy ones (teacher
    forcing, so a low-precision run is compared step by step with a reference); the recorded
    tokens are always the greedy ones."""
    fed = {p.id: 0 for p in prompts}
    out: dict[int, list[int]] = {p.id: [] for p in prompts}
    steps = []
    active = list(prompts)
    while active:
        entries, feed = [], {}
        for p in active:
            if fed[p.id] < len(p.tokens):
                rows = min(chunk, len(p.tokens) - fed[p.id])
                feed[p.id] = list(p.tokens[fed[p.id]: fed[p.id] + rows])
            else:
                k = len(out[p.id]) - 1
                feed[p.id] = [forced[p.id][k] if forced else out[p.id][k]]
            entries.append(StepRequest(p.id, p.owner, fed[p.id], len(feed[p.id])))
        batch = StepBatch.build(entries, T, page_size)
        tokens = torch.tensor([t for r in batch.requests for t in feed[r.id]], dtype=torch.int64)
        logits = step(batch, tokens).float().cpu().numpy()
        steps.append((tuple(int(i) for i in batch.ids), logits))
        for row, req in enumerate(batch.requests):
            fed[req.id] += req.rows
            if fed[req.id] >= len(next(p for p in active if p.id == req.id).tokens):
                out[req.id].append(int(np.argmax(logits[row])))
        done = [p for p in active if len(out[p.id]) >= new_tokens]
        for p in done:
            if release is not None:
                release(p.id)
        active = [p for p in active if len(out[p.id]) < new_tokens]
    return Generation(steps, out)
