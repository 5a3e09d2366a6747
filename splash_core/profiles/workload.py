"""Workload profiles: the requests a deployment serves, as data (for the simulator and the
serving engine alike).

Two kinds, both seeded and deterministic:

- ``sweep``: the paper's fixed-layout protocol (§5.2): B requests at client concurrency B,
  each with an input of L tokens and 1,024 output tokens.
- ``rollout``: an RL rollout step: many requests start together, most finish early and a
  few long reasoning traces (the long tail) keep the group busy until they end.

:meth:`WorkloadProfile.requests` yields concrete :class:`RequestSpec` objects; every request
generates exactly ``max_new_tokens`` (no early stop), as the paper's protocol does.
:meth:`WorkloadProfile.prompt_token_ids` gives each request's synthetic prompt ids.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .schema import Problem, field, non_negative, positive


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """One request to serve."""

    id: int
    prompt_tokens: int
    max_new_tokens: int
    arrival_s: float = 0.0  # seconds after the workload starts


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """One position of the paper's fixed-layout sweep."""

    requests: int = field("B: number of requests", checks=[positive])
    input_tokens: int = field("L_in: prompt tokens of every request", checks=[positive])
    output_tokens: int = field("tokens every request generates", default=1024, checks=[positive])
    concurrency: int | None = field("requests in flight at most (default: B, the paper's protocol)", default=None)


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """Requests that start together; ``long_tail_requests`` of them run far longer."""

    requests: int = field("requests launched together", checks=[positive])
    prompt_tokens: tuple[int, ...] = field("[min, max] of the uniform integer prompt length")
    output_tokens: tuple[int, ...] = field("[min, max] of the uniform integer output length of most requests")
    long_tail_requests: int = field("how many requests draw from long_tail_tokens instead", default=0,
                                    checks=[non_negative])
    long_tail_tokens: tuple[int, ...] = field("[min, max] output length of the long tail", default=(0, 0))
    concurrency: int | None = field("requests in flight at most (default: all)", default=None)

    def problems(self):
        for key in ("prompt_tokens", "output_tokens") + (("long_tail_tokens",) if self.long_tail_requests else ()):
            value = getattr(self, key)
            if len(value) != 2 or not 0 < value[0] <= value[1]:
                yield Problem(key, "must be [min, max] with 0 < min <= max", list(value))
        if self.long_tail_requests > self.requests:
            yield Problem("long_tail_requests", f"must be at most requests ({self.requests})", self.long_tail_requests)


@dataclasses.dataclass(frozen=True)
class WorkloadProfile:
    """Requests to serve: a fixed sweep position or an RL rollout, seeded."""

    profile_kind = "workload"

    name: str = field("profile name")
    seed: int = field("seed for lengths, long-tail positions and prompt ids", default=0)
    sweep: SweepSpec | None = field("a fixed sweep position (give exactly one of sweep and rollout)", default=None)
    rollout: RolloutSpec | None = field("an RL rollout (give exactly one of sweep and rollout)", default=None)
    description: str = field("what it models, in words", default="")
    notes: str = field("caveats", default="")

    def problems(self):
        if (self.sweep is None) == (self.rollout is None):
            yield Problem("sweep", "give exactly one of a sweep and a rollout section")
            return
        concurrency = self._spec.concurrency
        if concurrency is not None and concurrency < 1:
            yield Problem(f"{self.pattern}.concurrency", "must be >= 1", concurrency)

    @property
    def pattern(self) -> str:
        """'sweep' or 'rollout'."""
        return "sweep" if self.sweep is not None else "rollout"

    @property
    def _spec(self):
        return self.sweep if self.sweep is not None else self.rollout

    @property
    def concurrency(self) -> int:
        """Requests in flight at most."""
        return self._spec.concurrency or self._spec.requests

    def requests(self) -> tuple[RequestSpec, ...]:
        """The concrete requests, in arrival order (ids 0..n-1)."""
        if self.sweep is not None:
            s = self.sweep
            return tuple(RequestSpec(i, s.input_tokens, s.output_tokens) for i in range(s.requests))
        r = self.rollout
        rng = np.random.Generator(np.random.PCG64(self.seed))
        prompts = rng.integers(r.prompt_tokens[0], r.prompt_tokens[1], size=r.requests, endpoint=True)
        outputs = rng.integers(r.output_tokens[0], r.output_tokens[1], size=r.requests, endpoint=True)
        if r.long_tail_requests:
            tail = rng.choice(r.requests, size=r.long_tail_requests, replace=False)
            outputs[tail] = rng.integers(r.long_tail_tokens[0], r.long_tail_tokens[1],
                                         size=r.long_tail_requests, endpoint=True)
        return tuple(RequestSpec(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs)))

    def prompt_token_ids(self, request: RequestSpec, vocab_size: int) -> np.ndarray:
        """Synthetic prompt ids of one request, in [0, vocab_size), the same on every call."""
        rng = np.random.Generator(np.random.PCG64([self.seed, request.id]))
        return rng.integers(0, vocab_size, size=request.prompt_tokens, dtype=np.int64)

    @property
    def total_tokens(self) -> int:
        """Σ (prompt + output): the numerator of the paper's total throughput."""
        return sum(r.prompt_tokens + r.max_new_tokens for r in self.requests())
