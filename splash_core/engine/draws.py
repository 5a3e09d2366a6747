"""The uniform numbers sampled outputs are chosen at: drawn on rank 0 when it plans a step, from
``(seed, request id, output index)`` (or ``(seed, output index)`` for a request whose seed stands
alone, as an API's ``seed`` promises the same tokens in any request), so any output's draw can be
recomputed alone and the reference check replays it exactly. Every rank then chooses the token on
its device (:mod:`splash_core.runtime.sampling`) from what the plan carries (:class:`StepSampling`)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ..runtime.sampling import RowDraw, SamplingParams


def uniform(params: SamplingParams, request_id: int, index: int) -> float:
    """The uniform draw of output ``index`` of request ``request_id``."""
    return float(uniforms([params], [request_id], [index])[0])


def uniforms(params: Sequence[SamplingParams], request_ids: Sequence[int], indexes: Sequence[int]) -> np.ndarray:
    """Each row's :func:`uniform` at once, in [0, 1): a counter-based hash (SplitMix64's mixer)
    of (seed, request id, output index), so planning a step of many sampled rows costs
    microseconds and any output's draw can be recomputed alone."""
    h = _mix(_u64([p.seed for p in params]) ^ np.uint64(0x9E3779B97F4A7C15))
    alone = np.array([p.seed_alone for p in params], dtype=bool)
    h = np.where(alone, h, _mix(h ^ _u64(request_ids)))
    h = _mix(h ^ _u64(indexes) ^ np.uint64(0xD1B54A32D192ED03))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _u64(values) -> np.ndarray:
    """Python integers (any sign or size) as uint64, modulo 2^64."""
    return np.array([v % (1 << 64) for v in values], dtype=np.uint64)


def _mix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as the mixer intends
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


# ---- what a step's plan carries for its outputs (rank 0 -> every rank) ----------------------

_INTS, _REALS = ("row", "request", "top_k", "min_tokens", "stops"), (
    "temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "u")


@dataclasses.dataclass(frozen=True)
class StepSampling:
    """A step's sampling section of the plan: its draws (:class:`RowDraw`), the requests whose fed
    tokens enter their history (``tracked``: (id, prompt tokens)), and those whose every row's
    logits are wanted (``scored``: prompt logprobs)."""

    draws: tuple[RowDraw, ...] = ()
    tracked: tuple[tuple[int, int], ...] = ()
    scored: tuple[int, ...] = ()

    def encode(self) -> np.ndarray:
        """int64: [draws, tracked, scored, stop ids], then a row per draw (its reals as the int64 bits
        of their float64), the stop ids masked, the tracked pairs and the scored ids; empty when
        there is nothing."""
        if not (self.draws or self.tracked or self.scored):
            return np.zeros(0, np.int64)
        stops = [t for d in self.draws for t in d.params.stop_token_ids if d.params.min_tokens]
        ints = np.array([[d.row, d.request, d.params.top_k, d.params.min_tokens,
                          len(d.params.stop_token_ids) if d.params.min_tokens else 0] for d in self.draws],
                        dtype=np.int64).reshape(-1, len(_INTS))
        reals = np.array([[getattr(d.params, name) for name in _REALS[:-1]] + [d.u] for d in self.draws],
                         dtype=np.float64).reshape(-1, len(_REALS)).view(np.int64)
        head = [len(self.draws), len(self.tracked), len(self.scored), len(stops)]
        return np.concatenate([np.array(head, np.int64), np.concatenate([ints, reals], axis=1).reshape(-1),
                               np.array(stops, np.int64), np.array(self.tracked, np.int64).reshape(-1),
                               np.array(self.scored, np.int64)])

    @classmethod
    def decode(cls, body: np.ndarray) -> "StepSampling":
        if not body.size:
            return cls()
        n_draw, n_tracked, n_scored, n_stop = (int(v) for v in body[:4])
        width = len(_INTS) + len(_REALS)
        rows = body[4: 4 + width * n_draw].reshape(-1, width)
        reals = np.ascontiguousarray(rows[:, len(_INTS):]).view(np.float64)
        at = 4 + width * n_draw
        stops, at = body[at: at + n_stop].tolist(), at + n_stop
        draws = []
        for r, x in zip(rows.tolist(), reals.tolist()):
            row, request, top_k, min_tokens, n = r[: len(_INTS)]
            named = dict(zip(_REALS, x))
            u = named.pop("u")
            params = SamplingParams(top_k=top_k, min_tokens=min_tokens, stop_token_ids=tuple(stops[:n]), **named)
            draws.append(RowDraw(row, params, u, request))
            stops = stops[n:]
        tracked = tuple(map(tuple, body[at: at + 2 * n_tracked].reshape(-1, 2).tolist()))
        return cls(tuple(draws), tracked, tuple(body[at + 2 * n_tracked: at + 2 * n_tracked + n_scored].tolist()))


def step_sampling(members, by_id) -> StepSampling:
    """The sampling section of a step of ``members`` (batch order) of the requests ``by_id``:
    a draw for every output that samples or whose logits are adjusted (its uniform number that of
    the output index it will have, counting outputs booked ahead and not yet confirmed; stop ids
    sent only while ``min_tokens`` still masks them), the requests that keep a history, and the
    prefilling ones whose prompt logprobs need more rows than the last."""
    rows, tracked, scored = [], [], []
    for row, q in enumerate(members):
        r = by_id[q.id]
        p = r.sampling
        if p.needs_history:
            tracked.append((r.id, r.prompt_tokens))
        if r.prompt_logprobs is not None and q.start < r.prompt_tokens and q.rows > 1:
            scored.append(r.id)
        if r.outputs_this_step(q.rows) and (not p.greedy or p.needs_history):
            rows.append((row, r))
    draws = ()
    if rows:
        params = [r.sampling for _, r in rows]
        u = uniforms(params, [r.id for _, r in rows], [len(r.generated) + r.ahead for _, r in rows])
        draws = tuple(RowDraw(row, _on_the_wire(r), float(x), r.id if r.sampling.needs_history else -1)
                      for (row, r), x in zip(rows, u))
    return StepSampling(draws, tuple(tracked), tuple(scored))


def _on_the_wire(request) -> SamplingParams:
    """The parameters a request's draw carries: its own, without the stop ids once ``min_tokens``
    no longer masks them (outputs so far, booked ahead included, reached it)."""
    p = request.sampling
    if p.min_tokens and len(request.generated) + request.ahead >= p.min_tokens:
        return dataclasses.replace(p, min_tokens=0)
    return p
