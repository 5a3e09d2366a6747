"""Choosing each request's next token from its logits on the device: greedy, or sampled with
temperature, top-k, top-p and min-p; and when a request stops (EOS / stop ids, ``max_new_tokens``).

Before choosing, :func:`adjust_logits` applies what depends on the request's tokens so far
(``min_tokens``, the repetition, presence and frequency penalties) to the raw logits: one pure
function of (logits, params, :class:`History`) that the engine (every rank, on its device) and the
reference check both call. Defaults leave the logits untouched (the same tensors, bit for bit).

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
    min_p: float = 0.0  # keep tokens whose probability is at least min_p x the most likely one's
    min_tokens: int = 0  # stop ids are masked until this many tokens were generated
    repetition_penalty: float = 1.0  # HF/vLLM: logits of prompt and output tokens / p (> 0) or x p (<= 0)
    presence_penalty: float = 0.0  # OpenAI: minus this from every token generated at least once
    frequency_penalty: float = 0.0  # OpenAI: minus this x how often each token was generated

    def __post_init__(self):
        for name, bad, want in (("temperature", not self.temperature >= 0, ">= 0"), ("top_k", self.top_k < 0, ">= 0"),
                                ("top_p", not 0 < self.top_p <= 1, "in (0, 1]"),
                                ("min_p", not 0 <= self.min_p <= 1, "in [0, 1]"),
                                ("min_tokens", self.min_tokens < 0, ">= 0"),
                                ("repetition_penalty", not 0 < self.repetition_penalty < float("inf"), "> 0"),
                                ("presence_penalty", not -2 <= self.presence_penalty <= 2, "in [-2, 2]"),
                                ("frequency_penalty", not -2 <= self.frequency_penalty <= 2, "in [-2, 2]")):
            if bad:
                raise ValueError(f"{name} must be {want} (got {getattr(self, name)})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether a penalty changes the logits (then its tokens so far are kept: :class:`History`)."""
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def needs_history(self) -> bool:
        """Whether :func:`adjust_logits` reads the request's tokens so far (penalties, ``min_tokens``)."""
        return self.penalized or self.min_tokens > 0

    @property
    def adjusts(self) -> bool:
        """Whether anything but temperature, top-k and top-p shapes the choice."""
        return self.needs_history or self.min_p > 0


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
        if ids is None:  # a token min-p dropped has probability 0
            return (t < keep) & (probs.gather(1, t[:, None])[:, 0] > 0)
        first = torch.arange(ids.shape[1], device=ids.device)[None] < keep[:, None]
        return ((ids == t[:, None]) & first).any(-1)

    return _by_rows(logits, params, inside)


@dataclasses.dataclass(frozen=True)
class History:
    """Each row's tokens so far, on the logits' device: how often each token was generated
    (``counts`` [R, V], integers) and whether it is in the prompt (``prompt`` [R, V] bool). A row
    whose request keeps no history has zeros (every adjustment is then the identity)."""

    counts: torch.Tensor
    prompt: torch.Tensor

    @classmethod
    def of(cls, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], vocab: int,
           device="cpu") -> "History":
        """From token lists (the reference check, tests): row i's prompt and generated tokens."""
        counts = torch.zeros(len(prompts), vocab, dtype=torch.int32)
        prompt = torch.zeros(len(prompts), vocab, dtype=torch.bool)
        for i, (p, o) in enumerate(zip(prompts, outputs)):
            prompt[i, torch.as_tensor(list(p), dtype=torch.int64)] = True
            counts[i].index_add_(0, torch.as_tensor(list(o), dtype=torch.int64), torch.ones(len(o), dtype=torch.int32))
        return cls(counts.to(device), prompt.to(device))


def adjust_logits(logits: torch.Tensor, params: Sequence[SamplingParams], history: History | None) -> torch.Tensor:
    """The logits [R, V] each row chooses from, given its request's tokens so far (``history``):
    stop ids at -inf while fewer than ``min_tokens`` tokens were generated; the repetition penalty
    over prompt and generated tokens (a positive logit divided by it, any other multiplied: HF and
    vLLM); the frequency and presence penalties over generated tokens (OpenAI). Pure; ``logits``
    itself (no copy) when no row's parameters adjust anything."""
    if not any(p.needs_history for p in params):
        return logits
    if history is None:
        raise ValueError("penalties and min_tokens need the requests' tokens so far (a History)")
    device, out = logits.device, logits
    column = lambda values: to_device(np.array(values, dtype=np.float32), device, out.dtype)[:, None]  # noqa: E731
    counts = history.counts.to(device)
    if any(p.repetition_penalty != 1 for p in params):
        penalty = column([p.repetition_penalty for p in params])
        seen = history.prompt.to(device) | (counts > 0)
        out = torch.where(seen, torch.where(out > 0, out / penalty, out * penalty), out)
    if any(p.frequency_penalty or p.presence_penalty for p in params):
        frequency = column([p.frequency_penalty for p in params])
        presence = column([p.presence_penalty for p in params])
        out = out - counts.to(out.dtype) * frequency - (counts > 0).to(out.dtype) * presence
    masked = [(i, t) for i, p in enumerate(params) if p.min_tokens for t in p.stop_token_ids if 0 <= t < out.shape[-1]]
    if masked:
        at = to_device(np.array(masked, dtype=np.int64).T, device, torch.int64)
        short = counts.sum(-1) < to_device(np.array([p.min_tokens for p in params]), device, torch.int64)
        stop = torch.zeros_like(out, dtype=torch.bool).index_put_((at[0], at[1]), short.index_select(0, at[0]))
        out = out.masked_fill(stop, float("-inf"))
    return out


@dataclasses.dataclass(frozen=True)
class RowDraw:
    """A step's output chosen other than by the plain argmax: row ``row`` of its tokens is
    :func:`choose` (greedy where ``params`` is) of that row's logits adjusted by :func:`adjust_logits`
    with ``params`` at ``u`` (the plan carries these to every rank); ``request`` names the history
    the adjustment reads (-1: none)."""

    row: int
    params: SamplingParams
    u: float
    request: int = -1


def apply_draws(greedy: torch.Tensor, logits: torch.Tensor, draws: Sequence[RowDraw],
                history: History | None = None) -> torch.Tensor:
    """The step's tokens: ``greedy`` [R] (the device's argmax) with every drawn row replaced by its
    choice from ``logits`` [R, V] (adjusted, with ``history``'s rows in the draws' order), on their
    device; nothing waits for the host."""
    if not draws:
        return greedy
    rows = to_device(np.array([d.row for d in draws]), greedy.device, torch.int64)
    params = [d.params for d in draws]
    picked = adjust_logits(logits.index_select(0, rows), params, history)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if len(sampled) == len(draws):  # every row samples (the usual sampled step)
        chosen = choose_rows(picked, params, [d.u for d in draws])
    else:
        chosen = picked.argmax(dim=-1)
        if sampled:
            at = to_device(np.array(sampled), greedy.device, torch.int64)
            chosen = chosen.index_copy(0, at, choose_rows(picked.index_select(0, at), [params[i] for i in sampled],
                                                          [draws[i].u for i in sampled]))
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
    # a non-finite row (a broken checkpoint) still chooses a token of the vocabulary, not an index past it;
    # the reference check reports where the non-finite values came from
    probs = torch.nan_to_num(probs, nan=0.0)
    vocab = probs.shape[-1]
    min_p = None
    if any(p.min_p for p in params):
        min_p = to_device(np.array([p.min_p for p in params]), device, torch.float64)
    if all(not p.top_k and p.top_p >= 1 for p in params):
        if min_p is not None:  # vocabulary order: min-p zeroes what it drops (no sort needed)
            probs = torch.where(probs >= min_p[:, None] * probs.max(-1, keepdim=True).values, probs, 0.0)
        return probs, None, torch.full((len(params),), vocab, device=device)
    width = min(vocab, max(p.top_k for p in params) or vocab)
    probs, ids = _most_likely(probs, width)
    keep = to_device(np.array([min(p.top_k, width) if p.top_k else width for p in params]), device, torch.int64)
    if min(p.top_p for p in params) < 1:
        top_p = to_device(np.array([p.top_p for p in params]), device, torch.float64)
        reach = torch.searchsorted(probs.cumsum(-1), top_p[:, None])[:, 0] + 1
        keep = torch.where(top_p < 1, torch.minimum(keep, reach), keep)
    if min_p is not None:  # a prefix of the sorted tokens too: those within min_p of the first
        above = (probs >= min_p[:, None] * probs[:, :1]).sum(-1)
        keep = torch.where(min_p > 0, torch.minimum(keep, above), keep)
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
