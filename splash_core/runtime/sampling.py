"""Choosing each request's next token from its logits on the device: greedy, or sampled with
temperature, top-k and top-p; and when a request stops (EOS / stop ids, ``max_new_tokens``).

A sampled choice is a pure function of the logits, the parameters and one uniform number ``u``
(drawn on rank 0 from ``(seed, request id, output index)``: :mod:`splash_core.engine.draws`), so
the reference check replays it exactly (:func:`choose` with the reference's logits). The plan
carries each sampled row's draw (:class:`RowDraw`) to every rank, and every rank chooses on its
device from the same logits (:func:`apply_draws`: float64, every row of the step at once), as it
does the greedy argmax: the tokens stay on the device, and a sampled step is booked ahead of them
like a greedy one."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch

from ..platform.device import to_device


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request chooses tokens and when it stops."""

    temperature: float = 0.0  # 0: greedy (argmax, lowest index on ties)
    top_k: int = 0  # keep the k most likely tokens (0: all)
    top_p: float = 1.0  # keep the smallest set of most likely tokens whose probability reaches p
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()  # finishing tokens (EOS and user stop ids), emitted then stop
    seed_alone: bool = False  # draws depend on (seed, output index) only, not on the request's id

    def __post_init__(self):
        for name, bad in (("temperature", self.temperature < 0), ("top_k", self.top_k < 0),
                          ("top_p", not 0 < self.top_p <= 1)):
            if bad:
                raise ValueError(f"{name} must be {'in (0, 1]' if name == 'top_p' else '>= 0'} "
                                 f"(got {getattr(self, name)})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


def choose(logits: torch.Tensor, params: SamplingParams, u: float) -> int:
    """One token from ``logits`` [V]: greedy, or the inverse CDF at ``u`` of the temperature-scaled,
    top-k and top-p filtered distribution over the kept tokens in :func:`kept`'s order."""
    if params.greedy:
        return int(logits.argmax())
    return int(choose_rows(logits[None], [params], [u])[0])


def kept(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, token ids) of the tokens a sampled request may choose, in the order its
    inverse CDF walks them: most likely first (ties: lower id first) where a top-k or top-p
    filter applies, else every token in vocabulary order (the same distribution, without a sort)."""
    probs, ids, keep = _kept(logits[None], [params])
    n = int(keep[0])
    return probs[0, :n], (torch.arange(n, device=logits.device) if ids is None else ids[0, :n])


def choose_rows(logits: torch.Tensor, params: Sequence[SamplingParams], draws: Sequence[float]) -> torch.Tensor:
    """:func:`choose` of every row of ``logits`` [R, V] (all sampling) at its uniform number
    ``draws[i]``, on the logits' device: tokens [R] int64 there, without waiting for the device
    (small host arrays go over by :func:`to_device`: a plain copy would drain the stream)."""

    def pick(rows, probs, ids, keep):
        cdf = probs.cumsum(-1)
        u = to_device(np.array([draws[r] for r in rows]), logits.device, torch.float64)[:, None]
        at = torch.searchsorted(cdf, u * cdf.gather(1, keep[:, None] - 1), right=True)[:, 0]
        at = torch.minimum(at, keep - 1)
        return at if ids is None else ids.gather(1, at[:, None])[:, 0]

    return _by_rows(logits, params, pick)


def in_kept(logits: torch.Tensor, params: Sequence[SamplingParams], tokens: torch.Tensor) -> torch.Tensor:
    """Whether each row's token [R] is among the tokens :func:`kept` leaves that row (bool [R])."""
    tokens = tokens.to(logits.device)

    def inside(rows, probs, ids, keep):
        t = tokens.index_select(0, to_device(np.array(rows), logits.device, torch.int64))
        if ids is None:
            return t < keep
        first = torch.arange(ids.shape[1], device=ids.device)[None] < keep[:, None]
        return ((ids == t[:, None]) & first).any(-1)

    return _by_rows(logits, params, inside)


@dataclasses.dataclass(frozen=True)
class RowDraw:
    """A step's sampled output: row ``row`` of its tokens is :func:`choose` of that row's logits
    with ``params`` at ``u`` (the plan carries these to every rank)."""

    row: int
    params: SamplingParams
    u: float


def apply_draws(greedy: torch.Tensor, logits: torch.Tensor, draws: Sequence[RowDraw]) -> torch.Tensor:
    """The step's tokens: ``greedy`` [R] (the device's argmax) with every drawn row replaced by its
    :func:`choose_rows` of ``logits`` [R, V], on their device; nothing waits for the host."""
    if not draws:
        return greedy
    rows = to_device(np.array([d.row for d in draws]), greedy.device, torch.int64)
    chosen = choose_rows(logits.index_select(0, rows), [d.params for d in draws], [d.u for d in draws])
    return greedy.index_copy(0, rows, chosen)


_CHUNK_ELEMENTS = 1 << 22  # rows per pass hold ~32 MiB of float64 each (a vocabulary of 129K: 32 rows)


def _by_rows(logits: torch.Tensor, params: Sequence[SamplingParams], fn) -> torch.Tensor:
    """``fn(rows, probs, ids, keep)`` over groups of rows kept alike (:func:`_kept`), in passes
    whose float64 copies stay small (the KV pool fills the rest of device memory); the results
    [R] in row order."""
    plain = [i for i, p in enumerate(params) if not p.top_k and p.top_p >= 1]
    top_k = [i for i, p in enumerate(params) if p.top_k]
    sorted_all = [i for i, p in enumerate(params) if not p.top_k and p.top_p < 1]
    step = max(1, _CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    order, parts = [], []
    for group in (plain, top_k, sorted_all):
        for start in range(0, len(group), step):
            rows = group[start: start + step]
            part = logits.index_select(0, to_device(np.array(rows), logits.device, torch.int64))
            parts.append(fn(rows, *_kept(part, [params[r] for r in rows])))
            order += rows
    out = torch.cat(parts)
    if order == sorted(order):  # one group (the usual step): already in row order
        return out
    return out.index_select(0, to_device(np.argsort(order), logits.device, torch.int64))


def _kept(logits: torch.Tensor, params: Sequence[SamplingParams]):
    """(probabilities [r, C], token ids [r, C] or None for vocabulary order, tokens kept [r]) of
    rows that all take no filter, or all a top-k, or all top-p alone: float64 on the logits'
    device. A top-k row needs only its k most likely tokens (C = the rows' largest k); top-p alone
    needs them all sorted; the kept prefix is the top-k, cut to the smallest reaching top-p."""
    device = logits.device
    temperature = to_device(np.array([p.temperature for p in params]), device, torch.float64)
    probs = torch.softmax(logits.double() / temperature[:, None], dim=-1)
    vocab = probs.shape[-1]
    if all(not p.top_k and p.top_p >= 1 for p in params):
        return probs, None, torch.full((len(params),), vocab, device=device)
    width = min(vocab, max(p.top_k for p in params) or vocab)
    probs, ids = _most_likely(probs, width)
    keep = to_device(np.array([min(p.top_k, width) if p.top_k else width for p in params]), device, torch.int64)
    if min(p.top_p for p in params) < 1:
        top_p = to_device(np.array([p.top_p for p in params]), device, torch.float64)
        reach = torch.searchsorted(probs.cumsum(-1), top_p[:, None])[:, 0] + 1
        keep = torch.where(top_p < 1, torch.minimum(keep, reach), keep)
    return probs, ids, keep


def _most_likely(probs: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``width`` tokens of each row in (probability descending, id ascending) order:
    (their probabilities, their ids), [r, width] each. Below the whole vocabulary, a top-k finds
    the width-th largest value and the lowest ids among the tokens tied at it fill the set exactly,
    so no row sorts its whole vocabulary (nor asks the host how many tied)."""
    vocab = probs.shape[-1]
    if width >= vocab:
        return probs.sort(dim=-1, descending=True, stable=True)
    edge = probs.topk(width, dim=-1, sorted=False).values.min(-1, keepdim=True).values
    above = probs > edge
    tied = probs == edge
    take = above | (tied & (tied.cumsum(-1) <= width - above.sum(-1, keepdim=True)))
    position = torch.arange(vocab, device=probs.device)
    ids = torch.where(take, position, position + vocab).topk(width, dim=-1, largest=False, sorted=True).values
    chosen, order = probs.gather(1, ids).sort(dim=-1, descending=True, stable=True)
    return chosen, ids.gather(1, order)
