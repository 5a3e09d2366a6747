"""The lifecycle of one request in the engine (kept on rank 0, which decides every step).

::

    waiting ──admit──> prefilling ──last prompt chunk──> decoding ──max_new_tokens or stop id──> finished
       └──────────reject (no layout can ever hold it)──> rejected
    (any unfinished state) ──abort (a served client went away or the server stops)──> aborted

A request is admitted with its owner rank (chosen from projected KV growth,
:func:`splash_core.planning.ownership.assign_owner`) and keeps it in every layout. Prefill feeds the
prompt in chunks; the step that feeds the last prompt token yields the first generated token,
and every decode step feeds the last generated token and yields the next, chosen by the
request's :class:`~splash_core.runtime.sampling.SamplingParams`. A request generates
``max_new_tokens`` tokens, or fewer when it emits one of its stop ids (EOS; workload requests have
none: the paper's protocol generates exactly ``max_new_tokens``); the last generated token is
never fed back, so its history peaks at ``prompt + max_new_tokens - 1`` tokens. A request of
``max_new_tokens = 0`` only scores its prompt (its prompt logprobs are its output: an evaluation
harness's loglikelihood) and finishes, by length, with the step that feeds its last prompt token.

A request may want the logprob of each generated token (``logprobs``: with its ``logprobs`` most
likely alternatives) and of each prompt token (``prompt_logprobs``, the same): rank 0 computes
them from the step's logits (:mod:`splash_core.engine.logprobs`) and keeps them here.

A step may be booked *ahead* of its tokens (rank 0 plans the next step while the device still
runs this one, issue 22 §3): :meth:`Request.advance_ahead` records its progress with the output
unknown, the next step feeds that output as a reference to this step's row on the device, and
:meth:`Request.confirm` fills it in once the tokens reach the host. A stop id found that late
finishes the request at the step that emitted it; the one row it got in the step planned
meanwhile is dropped.

Rank 0 stamps when a request arrived and when each of its tokens was chosen (monotonic clock),
from which runs and the server report time to first token, inter-token and end-to-end latency.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from ..profiles.workload import RequestSpec
from ..runtime.sampling import GREEDY, SamplingParams


class State(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"


@dataclasses.dataclass
class Request:
    """One request and how far it got. ``prompt`` holds its token ids."""

    spec: RequestSpec
    prompt: np.ndarray
    state: State = State.WAITING
    owner: int = -1
    fed: int = 0  # tokens already in its history (prompt tokens, then generated ones fed back)
    generated: list[int] = dataclasses.field(default_factory=list)
    reason: str = ""  # why it was rejected
    admitted_step: int = -1
    finished_step: int = -1
    sampling: SamplingParams = GREEDY
    finish_reason: str = ""  # "length" (max_new_tokens), "stop" (a stop id) or "abort"
    arrived_at: float = float("nan")  # time.monotonic() when it arrived
    token_times: list[float] = dataclasses.field(default_factory=list)  # time.monotonic() of each generated token
    ahead: int = 0  # outputs booked ahead of their tokens (not in ``generated`` yet)
    ahead_row: int = -1  # the row of the last such output in its step's tokens (batch order)
    logprobs: int | None = None  # None: no logprobs; k: each generated token's logprob and the k most likely
    prompt_logprobs: int | None = None  # the same for each prompt token (None: not wanted)
    token_logprobs: list = dataclasses.field(default_factory=list)  # messages.TokenLogprob per generated token
    prompt_scores: list = dataclasses.field(default_factory=list)  # TokenLogprob per prompt token but the first

    @property
    def id(self) -> int:
        return self.spec.id

    @property
    def prompt_tokens(self) -> int:
        return self.spec.prompt_tokens

    @property
    def reserved_tokens(self) -> int:
        """Tokens its history may reach (prompt + output): what admission and Eq 6 reserve."""
        return self.spec.prompt_tokens + self.spec.max_new_tokens

    @property
    def started(self) -> bool:
        """Whether it holds KV somewhere (then it must be in every step until it finishes, so a
        layout switch moves its history)."""
        return self.fed > 0

    def admit(self, owner: int, step: int) -> None:
        if self.state is not State.WAITING:
            raise RuntimeError(f"request {self.id}: admitted while {self.state.value}")
        self.state, self.owner, self.admitted_step = State.PREFILLING, owner, step

    def reject(self, reason: str) -> None:
        self.state, self.reason = State.REJECTED, reason

    @property
    def done(self) -> bool:
        return self.state in (State.FINISHED, State.REJECTED, State.ABORTED)

    def abort(self, step: int) -> None:
        self.state, self.finished_step, self.finish_reason = State.ABORTED, step, "abort"

    def feed(self, rows: int) -> np.ndarray:
        """The next ``rows`` tokens to feed: a prompt chunk, or (decoding) the last generated token."""
        if self.state is State.PREFILLING:
            if not 1 <= rows <= self.prompt_tokens - self.fed:
                raise ValueError(f"request {self.id}: {rows} prefill rows with {self.prompt_tokens - self.fed} left")
            return self.prompt[self.fed: self.fed + rows]
        if self.state is State.DECODING and rows == 1:
            if self.ahead:  # the device has it: a reference to that step's row (StepPlan's wire format)
                return np.array([-1 - self.ahead_row], dtype=np.int64)
            return np.array(self.generated[-1:], dtype=np.int64)
        raise ValueError(f"request {self.id}: cannot feed {rows} rows while {self.state.value}")

    def advance(self, rows: int, next_token: int, step: int) -> None:
        """Record a step that fed ``rows`` tokens and whose last row predicted ``next_token``."""
        self.fed += rows
        if self.state is State.PREFILLING and self.fed < self.prompt_tokens:
            return  # mid-prompt: the prediction is not an output
        if self._scored_only(step):
            return
        self.state = State.DECODING
        self.generated.append(int(next_token))
        if int(next_token) in self.sampling.stop_token_ids:
            self.state, self.finished_step, self.finish_reason = State.FINISHED, step, "stop"
        elif len(self.generated) >= self.spec.max_new_tokens:
            self.state, self.finished_step, self.finish_reason = State.FINISHED, step, "length"

    def advance_ahead(self, rows: int, step: int, row: int) -> bool:
        """Record a step that fed ``rows`` tokens before its tokens are known; its output (if any:
        returned) is row ``row`` of the step's tokens. Finishing by ``max_new_tokens`` is known
        now; a stop id only at :meth:`confirm`."""
        self.fed += rows
        if self.state is State.PREFILLING and self.fed < self.prompt_tokens or self._scored_only(step):
            return False
        self.state, self.ahead, self.ahead_row = State.DECODING, self.ahead + 1, row
        if len(self.generated) + self.ahead >= self.spec.max_new_tokens:
            self.state, self.finished_step, self.finish_reason = State.FINISHED, step, "length"
        return True

    def confirm(self, token: int, step: int) -> bool:
        """The token of an output booked ahead (:meth:`advance_ahead`) at ``step``; False when it is
        dropped: the request was aborted meanwhile, or stopped at an earlier step."""
        if self.state is State.ABORTED or self.finish_reason == "stop":
            return False
        self.ahead -= 1
        self.generated.append(int(token))
        if int(token) in self.sampling.stop_token_ids:
            self.state, self.finished_step, self.finish_reason = State.FINISHED, step, "stop"
        return True

    def outputs_this_step(self, rows: int) -> bool:
        """Whether a step feeding ``rows`` of this request yields an output token."""
        return self.fed + rows >= self.prompt_tokens and self.spec.max_new_tokens > 0

    def _scored_only(self, step: int) -> bool:
        """The prompt was fed: a request that generates nothing finishes (by length) here."""
        if self.spec.max_new_tokens:
            return False
        self.state, self.finished_step, self.finish_reason = State.FINISHED, step, "length"
        return True


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """A request given by its prompt's token ids (``splash generate``), not drawn from a workload."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = GREEDY

    def __post_init__(self):
        if not self.prompt:
            raise ValueError("a prompt needs at least one token")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
