"""Choosing each request's next token from its logits: greedy, or sampled with temperature, top-k
and top-p, from a per-request seed; and when a request stops (EOS / stop ids, ``max_new_tokens``).

A sampled choice is a pure function of the logits, the parameters and one uniform number ``u``
drawn from ``(seed, request id, output index)`` (or ``(seed, output index)`` for a request whose
seed stands alone, as an API's ``seed`` promises the same tokens in any request), so the
reference check replays it exactly (:func:`choose` with the reference's logits). Rank 0 draws
``u`` when it plans the step, the plan carries each sampled row's draw (:class:`RowDraw`) to
every rank, and every rank chooses on its device from the same logits (:func:`apply_draws`:
float64, every row of the step at once), as it does the greedy argmax: the tokens stay on the
device, and a sampled step is booked ahead of them like a greedy one."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch


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


def uniform(params: SamplingParams, request_id: int, index: int) -> float:
    """The uniform draw of output ``index`` of request ``request_id``."""
    key = [params.seed, index] if params.seed_alone else [params.seed, request_id, index]
    return float(np.random.default_rng(key).random())


def choose(logits: torch.Tensor, params: SamplingParams, u: float) -> int:
    """One token from ``logits`` [V]: greedy, or the inverse CDF at ``u`` of the temperature-scaled,
    top-k and top-p filtered distribution (most likely tokens first)."""
    if params.greedy:
        return int(logits.argmax())
    return int(choose_rows(logits[None], [params], [u])[0])


def kept(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, token ids) of the tokens a sampled request may choose, most likely first."""
    probs, order, keep = _filtered(logits[None], [params])
    return probs[0, :keep[0]], order[0, :keep[0]]


def choose_rows(logits: torch.Tensor, params: Sequence[SamplingParams], uniforms: Sequence[float]) -> torch.Tensor:
    """:func:`choose` of every row of ``logits`` [R, V] (all sampling), on the logits' device:
    tokens [R] int64 there."""
    out = []
    for rows in _chunks(logits):
        probs, order, keep = _filtered(logits[rows], params[rows])
        cdf = probs.cumsum(-1)
        u = torch.tensor(uniforms[rows], dtype=torch.float64, device=logits.device)[:, None]
        at = torch.searchsorted(cdf, u * cdf.gather(1, keep[:, None] - 1), right=True)[:, 0]
        out.append(order.gather(1, torch.minimum(at, keep - 1)[:, None])[:, 0])
    return torch.cat(out)


def in_kept(logits: torch.Tensor, params: Sequence[SamplingParams], tokens: torch.Tensor) -> torch.Tensor:
    """Whether each row's token [R] is among the tokens :func:`kept` leaves that row (bool [R])."""
    out = []
    for rows in _chunks(logits):
        _, order, keep = _filtered(logits[rows], params[rows])
        rank = (order == tokens[rows, None].to(order.device)).int().argmax(-1)  # every id appears once
        out.append(rank < keep)
    return torch.cat(out)


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
    rows = [d.row for d in draws]
    out = greedy.clone()
    out[rows] = choose_rows(logits[rows], [d.params for d in draws], [d.u for d in draws])
    return out


_CHUNK_ELEMENTS = 1 << 22  # rows per pass hold ~32 MiB of float64 each (a vocabulary of 129K: 32 rows)


def _chunks(logits: torch.Tensor) -> list[slice]:
    """Row ranges whose float64 copies stay small: the pool fills the rest of device memory."""
    step = max(1, _CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    return [slice(i, i + step) for i in range(0, logits.shape[0], step)]


def _filtered(logits: torch.Tensor, params: Sequence[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probabilities [R, V] most likely first, their token ids [R, V], tokens kept [R]) of each
    row's temperature-scaled distribution after its top-k and top-p filters, in float64 on the
    logits' device (the smallest prefix reaching top_p, at least one token)."""
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float64, device=device)
    probs, order = torch.softmax(logits.double() / temperature[:, None], dim=-1).sort(dim=-1, descending=True, stable=True)
    vocab = probs.shape[-1]
    keep = torch.tensor([min(p.top_k, vocab) if p.top_k else vocab for p in params], device=device)
    top_p = [p.top_p for p in params]
    if min(top_p) < 1:
        reach = torch.searchsorted(probs.cumsum(-1), torch.tensor(top_p, dtype=torch.float64, device=device)[:, None])
        keep = torch.where(torch.tensor(top_p, device=device) < 1, torch.minimum(keep, reach[:, 0] + 1), keep)
    return probs, order, keep
