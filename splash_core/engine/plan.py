"""The step plan: what rank 0 decided for one step, broadcast so every rank runs the same step.

Wire format (int64, two broadcasts from rank 0 per step over the host collectives, so planning
never waits for the device): a fixed header
``[command, step, layout, requests, tokens, releases, report, precopy_steps, sampling]``, then a body
holding, in order, ``requests`` x (id, owner, start, rows) in batch order, the ``tokens`` to feed
(rows in batch order), the ids of finished requests whose pages every rank frees before the
step, and ``sampling`` words of the step's sampling section
(:class:`~splash_core.engine.draws.StepSampling`: its draws, with their reals as the int64 bits
of their float64, the requests that keep a token history and those whose prompt logprobs need
every row's logits). The tokens reach the device by an asynchronous copy.

Commands: STEP runs a step; IDLE frees the releases and runs nothing (rank 0 has nothing to run
yet: it sends one at least every second, so ranks waiting for work stay inside the collective
timeout, and aborted requests' pages are freed at once); STOP frees the releases and ends the
run; ABORT tells the other ranks that rank 0 failed while deciding (its own error says why), so
they stop instead of waiting for a collective that never comes. ``report`` asks every rank to
report its KV pool after the plan (:func:`splash_core.engine.steps.pool_usage`), for the
server's metrics.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np
import torch

from ..layouts import LAYOUTS, Layout
from ..platform.device import to_device
from ..runtime.sampling import RowDraw
from ..runtime.step_batch import StepBatch, StepRequest
from .draws import StepSampling

_HEADER = 9


class Command(enum.IntEnum):
    STEP = 0
    STOP = 1
    ABORT = 2
    IDLE = 3


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One step as every rank sees it."""

    command: Command
    step: int
    layout: Layout  # the layout the step runs in (a switch when it differs from the current one)
    requests: tuple[StepRequest, ...] = ()  # in batch (owner-major) order
    tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    releases: tuple[int, ...] = ()
    report: bool = False  # every rank reports its KV pool after this plan
    precopy_steps: int = 0  # a switch to ``layout`` goes by a pre-copy of this many steps (0: the policy's one step)
    draws: tuple[RowDraw, ...] = ()  # the step's sampled or adjusted outputs (every other output is the argmax)
    tracked: tuple[tuple[int, int], ...] = ()  # (id, prompt tokens) of requests whose fed tokens enter their history
    scored: tuple[int, ...] = ()  # requests whose every row's logits are wanted (prompt logprobs)

    def encode(self) -> tuple[np.ndarray, np.ndarray]:
        """(header [9], body) as int64 arrays."""
        sampling = StepSampling(self.draws, self.tracked, self.scored).encode()
        header = np.array([int(self.command), self.step, LAYOUTS.index(self.layout), len(self.requests),
                           len(self.tokens), len(self.releases), int(self.report), self.precopy_steps,
                           len(sampling)], dtype=np.int64)
        body = np.concatenate([np.array([[r.id, r.owner, r.start, r.rows] for r in self.requests],
                                        dtype=np.int64).reshape(-1),
                               np.asarray(self.tokens, dtype=np.int64), np.array(self.releases, dtype=np.int64),
                               sampling])
        return header, body

    def batch(self, T: int, page_size: int) -> StepBatch:
        return StepBatch.build(self.requests, T, page_size)


def exchange(collectives, device, plan: StepPlan | None,
             previous: torch.Tensor | None = None) -> tuple[StepPlan, torch.Tensor]:
    """Broadcast rank 0's ``plan`` (None on the other ranks) over the host ``collectives``; every
    rank returns the plan and the step's tokens as a tensor on ``device``, copied there
    asynchronously, references to ``previous`` (this rank's tokens [R] of the step before,
    on ``device``) taken from it there: nothing here waits for the device (issue 22 §3)."""
    header = torch.zeros(_HEADER, dtype=torch.int64)
    body = None
    if plan is not None:
        h, b = plan.encode()
        header = torch.from_numpy(h)
        body = torch.from_numpy(b)
    collectives.broadcast(header, src=0)
    command, step, layout, n_req, n_tok, n_rel, report, precopy_steps, n_sampling = (int(v) for v in header.tolist())
    size = 4 * n_req + n_tok + n_rel + n_sampling
    if body is None:
        body = torch.zeros(size, dtype=torch.int64)
    if size:
        collectives.broadcast(body, src=0)
    host = body.numpy()
    if plan is None:
        rows = host[: 4 * n_req].reshape(-1, 4)
        plan = StepPlan(Command(command), step, LAYOUTS[layout],
                        tuple(StepRequest(*map(int, r)) for r in rows),
                        host[4 * n_req: 4 * n_req + n_tok],
                        tuple(int(i) for i in host[4 * n_req + n_tok: 4 * n_req + n_tok + n_rel]),
                        bool(report), precopy_steps)
        sampling = StepSampling.decode(host[4 * n_req + n_tok + n_rel:])
        plan = dataclasses.replace(plan, draws=sampling.draws, tracked=sampling.tracked, scored=sampling.scored)
    return plan, _fed(host[4 * n_req: 4 * n_req + n_tok], device, previous, plan.step)


def _fed(tokens: np.ndarray, device, previous: torch.Tensor | None, step: int) -> torch.Tensor:
    """The step's tokens on ``device``, each reference ``-1 - j`` replaced by ``previous[j]``."""
    refs = np.flatnonzero(tokens < 0)
    out = to_device(np.where(tokens < 0, 0, tokens), device, torch.int64)
    if refs.size:
        rows = -1 - tokens[refs]
        if previous is None or int(rows.max()) >= previous.numel():
            raise RuntimeError(f"step {step}: the plan feeds rows {rows.tolist()} of the previous step's tokens, "
                               f"which this rank does not hold ({0 if previous is None else previous.numel()} rows)")
        out[to_device(refs, device, torch.int64)] = previous.index_select(0, to_device(rows, device, torch.int64))
    return out
