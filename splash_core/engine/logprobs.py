"""Logprobs of generated and prompt tokens, computed by rank 0 on its device in the step that
produced the logits (every rank holds the same logits; only rank 0 reports).

Which distribution: the model's raw one at that position, ``log_softmax`` of the logits before
temperature, penalties, min-p, top-k and top-p (vLLM's default, ``raw_logprobs``; OpenAI reports the
same kind of number), so a token's logprob does not depend on how it was chosen. A generated
token's entry is its own logprob and the ``k`` most likely tokens'; a prompt token's is the same,
for the prompt token at that position, from the logits of the row before it (position 0 has
none). A request's prompt rows other than a chunk's last are asked from the model only where a
request wants prompt logprobs (the plan's ``scored`` requests: :meth:`Model.scoring
<splash_core.runtime.model.Model.scoring>`).

:class:`LogprobJobs` are what rank 0 asks of a step; :meth:`LogprobJobs.compute` runs on the
device (one float64 tensor, copied to the host behind the step's tokens); :meth:`LogprobJobs.book`
turns the host copy into :class:`~splash_core.engine.messages.TokenLogprob` entries on the
requests; :func:`news` gives a step report's share of them.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
import torch

from ..platform.device import to_device
from .messages import TokenLogprob
from .plan import StepPlan
from .requests import Request, State

MAX_TOP = 20  # OpenAI's limit on alternatives per token
_BLOCK_ROWS = 256  # logits rows normalised at once (a 129K vocabulary: 128 MiB of float32)


def scored_rows(plan: StepPlan) -> np.ndarray | None:
    """The rows (indices into the step's rows) whose logits follow the last rows': every row but
    the last of each ``scored`` request, in batch order; None when there are none."""
    if not plan.scored:
        return None
    scored, rows, offset = set(plan.scored), [], 0
    for q in plan.requests:
        if q.id in scored:
            rows.append(np.arange(offset, offset + q.rows - 1))
        offset += q.rows
    rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return rows if rows.size else None


@dataclasses.dataclass(frozen=True)
class LogprobJobs:
    """What rank 0 computes of one step: per entry, the logits row, the target token (-1: the
    token the step chose at ``row``), how many alternatives, and whose entry it is."""

    logit_rows: np.ndarray  # rows of the step's logits [R + E]
    targets: np.ndarray  # prompt token scored, or -1 for the generated one
    output_rows: np.ndarray  # for a generated token: its row in the step's tokens (else 0)
    top: np.ndarray  # alternatives wanted
    owners: tuple[tuple[int, bool], ...]  # (request id, is a prompt token)

    @classmethod
    def of(cls, plan: StepPlan, requests: Mapping[int, Request]) -> "LogprobJobs | None":
        """The entries ``plan``'s step owes the requests that asked (None: none)."""
        scored = set(plan.scored)
        entries, extra = [], len(plan.requests)
        for i, q in enumerate(plan.requests):
            r = requests.get(q.id)
            if r is not None and r.prompt_logprobs is not None and q.start < r.prompt_tokens:
                before = list(range(extra, extra + q.rows - 1)) if q.id in scored else []
                extra += len(before)
                for row, position in zip(before + [i], range(q.start + 1, q.start + q.rows + 1)):
                    if position < r.prompt_tokens:
                        entries.append((row, int(r.prompt[position]), 0, r.prompt_logprobs, q.id, True))
            elif q.id in scored:
                extra += q.rows - 1
            outputs = q.start + q.rows >= r.prompt_tokens and r.spec.max_new_tokens if r is not None else False
            if outputs and r.logprobs is not None:
                entries.append((i, -1, i, r.logprobs, q.id, False))
        if not entries:
            return None
        rows, targets, outputs, top, ids, prompt = zip(*entries)
        return cls(np.array(rows), np.array(targets), np.array(outputs), np.minimum(np.array(top), MAX_TOP),
                   tuple(zip(ids, prompt)))

    def compute(self, tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """[n, 2 + 2K] float64 on the logits' device: each entry's logprob, its token, then the K
        most likely tokens' ids and logprobs (K: the most any entry wants). Rows go in blocks, each
        normalised by its log-sum-exp: no full log-softmax copy of a long prompt's logits."""
        device, k = logits.device, int(self.top.max())
        chosen = tokens.index_select(0, to_device(self.output_rows, device, torch.int64))
        targets = to_device(self.targets, device, torch.int64)
        targets = torch.where(targets < 0, chosen, targets)
        at = to_device(self.logit_rows, device, torch.int64)
        parts = []
        for lo in range(0, len(self.logit_rows), _BLOCK_ROWS):
            rows = logits.index_select(0, at[lo: lo + _BLOCK_ROWS]).float()
            norm = rows.logsumexp(-1, keepdim=True)
            best = rows.topk(k, dim=-1)
            own = rows.gather(1, targets[lo: lo + _BLOCK_ROWS, None]) - norm
            parts.append(torch.cat([own.double(), targets[lo: lo + _BLOCK_ROWS, None].double(),
                                    best.indices.double(), (best.values - norm).double()], 1))
        return torch.cat(parts)

    def book(self, host: np.ndarray, produced: list[Request], requests: Mapping[int, Request]) -> None:
        """Keep the entries on their requests: a prompt token's on its request, a generated
        token's on a request that got its token in the step (``produced``)."""
        got = {r.id for r in produced}
        k = (host.shape[1] - 2) // 2
        for (rid, prompt), row, top in zip(self.owners, host, self.top):
            r = requests.get(rid)
            if r is None or not (prompt or rid in got):
                continue
            pairs = sorted(zip(row[2: 2 + k].astype(np.int64).tolist(), row[2 + k:].tolist()),
                           key=lambda p: (-p[1], p[0]))
            entry = TokenLogprob(int(row[1]), float(row[0]), tuple(pairs[: int(top)]))
            (r.prompt_scores if prompt else r.token_logprobs).append(entry)


def news(plan: StepPlan, produced: list[Request], requests: Mapping[int, Request]) -> dict:
    """A step report's logprobs: ``logprobs`` of the generated tokens of requests that asked,
    ``prompt_logprobs`` of the prompts whose prefill ended in the step, and ``finished``: the
    requests that only scored their prompt (max_new_tokens 0), finished by length in the step."""
    ended = [requests[q.id] for q in plan.requests
             if q.id in requests and q.start + q.rows == requests[q.id].prompt_tokens]
    return {"logprobs": tuple((r.id, r.token_logprobs[-1]) for r in produced
                              if r.logprobs is not None and r.token_logprobs),
            "prompt_logprobs": tuple((r.id, (None,) + tuple(r.prompt_scores)) for r in ended
                                     if r.prompt_logprobs is not None and r.state is not State.ABORTED),
            "finished": tuple((r.id, r.finish_reason) for r in ended
                              if not r.spec.max_new_tokens and r.state is State.FINISHED)}
