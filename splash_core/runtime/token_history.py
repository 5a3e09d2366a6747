"""Each request's tokens so far, kept on every rank's device for the logit adjustments that read
them (:func:`~splash_core.runtime.sampling.adjust_logits`: penalties, ``min_tokens``).

Every step, the tokens the step feeds of a tracked request (its prompt chunk, or the token it
generated last, by reference to the device's tokens) are added to its rows here: prompt
positions to its prompt set, later ones to its counts of generated tokens. So by the time a
step's logits are adjusted its history holds the prompt and every token generated so far, and
nothing is rebuilt from host lists. The plan names the tracked requests (and their prompt
lengths) identically on every rank, so every rank holds the same history; it follows no layout
and a switch leaves it alone.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from ..platform.device import to_device
from .sampling import History
from .step_batch import StepRequest


class TokenHistory:
    """Counts [slots, V] and prompt sets [slots, V] of the tracked requests on one device; slot 0
    stays empty (the history of a row that keeps none)."""

    def __init__(self, vocab: int, device):
        self.vocab, self.device = vocab, device
        self.slots: dict[int, int] = {}
        self.free: list[int] = []
        self.counts = torch.zeros(1, vocab, dtype=torch.int32, device=device)
        self.prompt = torch.zeros(1, vocab, dtype=torch.bool, device=device)

    def feed(self, requests: Sequence[StepRequest], tokens: torch.Tensor, tracked: Mapping[int, int]) -> None:
        """Add the tokens a step feeds (``tokens`` [N] on the device, rows in the batch order of
        ``requests``) of the ``tracked`` requests (id -> prompt tokens)."""
        if not tracked:
            return
        rows, slots, in_prompt, offset = [], [], [], 0
        for q in requests:
            if q.id in tracked:
                rows.append(np.arange(offset, offset + q.rows))
                slots.append(np.full(q.rows, self._slot(q.id)))
                in_prompt.append(np.arange(q.start, q.start + q.rows) < tracked[q.id])
            offset += q.rows
        if not rows:
            return
        rows, slots, in_prompt = np.concatenate(rows), np.concatenate(slots), np.concatenate(in_prompt)
        fed = tokens.to(self.device).long().index_select(0, to_device(rows, self.device, torch.int64))
        for mask, table in ((in_prompt, self.prompt), (~in_prompt, self.counts)):
            if mask.any():
                at = to_device(np.flatnonzero(mask), self.device, torch.int64)
                index = (to_device(slots[mask], self.device, torch.int64), fed.index_select(0, at))
                table.index_put_(index, torch.ones(len(at), dtype=table.dtype, device=self.device),
                                 accumulate=table.dtype != torch.bool)

    def rows(self, requests: Sequence[int]) -> History:
        """The histories of ``requests`` (-1 or untracked: an empty one), in that order."""
        at = to_device(np.array([self.slots.get(r, 0) for r in requests], dtype=np.int64), self.device, torch.int64)
        return History(self.counts.index_select(0, at), self.prompt.index_select(0, at))

    def release(self, request: int) -> None:
        """Forget a finished request (every rank, with its pages)."""
        slot = self.slots.pop(request, None)
        if slot is not None:
            self.counts[slot] = 0
            self.prompt[slot] = False
            self.free.append(slot)

    def _slot(self, request: int) -> int:
        if request not in self.slots:
            if not self.free:  # grow by doubling (rarely: slots are reused)
                n = self.counts.shape[0]
                self.counts = torch.cat([self.counts, torch.zeros_like(self.counts)])
                self.prompt = torch.cat([self.prompt, torch.zeros_like(self.prompt)])
                self.free.extend(range(n, 2 * n))
            self.slots[request] = self.free.pop(0)
        return self.slots[request]
