"""What ``splash serve``'s front end and rank 0 of the engine send each other over their one
:mod:`multiprocessing` connection, as typed messages.

To the engine: :class:`AddRequest` (a request, its id unused so far), :class:`AbortRequests` (stop
these; unknown or finished ones are ignored), :class:`Close` (stop once every request is done).
To the front end: :class:`EngineReady` once every rank has loaded the model, a :class:`StepReport`
after every step (and after an IDLE plan that has news), :class:`EngineDone` when the run stopped.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from ..runtime.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class AddRequest:
    """A request; ``max_new_tokens`` may be 0 when ``prompt_logprobs`` is asked (it only scores its
    prompt). ``logprobs`` / ``prompt_logprobs``: None, or the number of most likely alternatives
    reported beside each generated / prompt token's logprob."""

    id: int
    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams
    logprobs: int | None = None
    prompt_logprobs: int | None = None


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model's raw distribution at its position (the logits
    before temperature, penalties and filters: vLLM's default), and the ``top`` most likely
    (token, logprob) pairs there, most likely first (ties: lower id first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class AbortRequests:
    ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Close:
    pass


@dataclasses.dataclass(frozen=True)
class EngineReady:
    """The group loaded the model: its initial layout, policy, KV pages per layer and rank, and
    rank 0's load report."""

    layout: str
    policy: str
    kv_pages: int
    load: dict


@dataclasses.dataclass(frozen=True)
class StepReport:
    """One step (or an IDLE plan with news) as the front end and its metrics see it."""

    step: int
    layout: str  # the layout the step ended in (the current layout after an IDLE plan)
    seconds: float = 0.0  # rank 0's wall time of the step, switch included (0 for an IDLE plan)
    phase: str = "idle"  # prefill, decode, mixed (both in one step), switch, or idle
    rows: int = 0
    tokens: tuple = ()  # (request id, token id) of every request that generated a token
    finished: tuple = ()  # (request id, finish reason) of requests that finished in the step
    rejected: tuple = ()  # (request id, reason) of requests admission refused
    # {src, dst, reason, refused, exposed_ms, kind, precopy} attempted in the step; kind: one_step,
    # precopy (handed off a pre-copy) or fell_back (one step after a pre-copy that could not hand off),
    # precopy: that pre-copy's record (engine.precopies.PreCopyRecord as a dict) or {}
    switches: tuple = ()
    waiting: int = 0  # requests that arrived and wait for admission
    running: int = 0
    pools: tuple | None = None  # every rank's pool usage (steps.pool_usage), when reported
    precopies: tuple = ()  # records (as dicts) of the pre-copies that began or ended in the step
    logprobs: tuple = ()  # (request id, TokenLogprob) of each generated token of a request that asked
    # (request id, (None, TokenLogprob, ...)): a prompt's logprobs (None for position 0), once its prefill ended
    prompt_logprobs: tuple = ()
    queued: tuple = ()  # (request id, seconds from its arrival at rank 0 to the start of its first step)


@dataclasses.dataclass(frozen=True)
class EngineDone:
    """The run stopped: its totals (steps, switches, pre-copies)."""

    totals: dict
