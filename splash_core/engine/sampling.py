"""Choosing each request's next token from its logits: greedy, or sampled with temperature, top-k
and top-p, from a per-request seed; and when a request stops (EOS / stop ids, ``max_new_tokens``).

Rank 0 decides (the logits are identical on every rank) and the step plan broadcasts the tokens,
so every layout's ranks feed the same tokens. A sampled choice is a pure function of the logits,
the parameters and one uniform number ``u`` drawn from ``(seed, request id, output index)`` (or
``(seed, output index)`` for a request whose seed stands alone, as an API's ``seed`` promises the
same tokens in any request), so the reference check replays it exactly (:func:`choose` with the reference's logits). Sampling
runs in float64 on the host: the inverse-CDF choice is then the same on every device.
"""

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
    probs, order = kept(logits, params)
    cdf = probs.cumsum(0)
    return int(order[min(int(torch.searchsorted(cdf, u * cdf[-1], right=True)), order.numel() - 1)])


def kept(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, token ids) of the tokens a sampled request may choose, most likely first."""
    x = logits.detach().to("cpu", torch.float64) / params.temperature
    probs, order = torch.softmax(x, dim=0).sort(descending=True, stable=True)
    keep = probs.numel() if not params.top_k else min(params.top_k, probs.numel())
    if params.top_p < 1:  # the smallest prefix reaching top_p (at least one token)
        keep = min(keep, int(torch.searchsorted(probs.cumsum(0), torch.tensor(params.top_p, dtype=torch.float64))) + 1)
    return probs[:keep], order[:keep]


def next_tokens(logits: torch.Tensor, params: Sequence[SamplingParams], request_ids: Sequence[int],
                indexes: Sequence[int]) -> np.ndarray:
    """Each row's token: ``params[i]`` of request ``request_ids[i]``, whose output ``indexes[i]``
    it is. Greedy rows take one argmax on the device together."""
    out = logits.argmax(dim=-1).cpu().numpy()
    for row, (p, rid, k) in enumerate(zip(params, request_ids, indexes)):
        if not p.greedy:
            out[row] = choose(logits[row], p, uniform(p, rid, k))
    return out
