"""A MoE layer's all-to-all path (:mod:`splash_core.planning.moe_dispatch`): each owner sends each of
its rows once to every rank holding one of the row's experts, with the row's expert ids and
weights; each rank returns one partial sum per row it received; the owner adds them.

A collective: every rank calls it, ranks owning no rows included. The ranks first exchange how many
rows each sends to each (a T-element all-to-all, read back to the host for the split sizes), so it
runs in eager steps only.
"""

from __future__ import annotations

from typing import Callable

import torch

from .exchange import pack_rows, unpack_rows


def dispatch_and_combine(collectives, T: int, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor,
                         experts_per_rank: int,
                         compute: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Own rows ``x`` [n, d] routed to ``experts`` [n, k] with ``weights`` [n, k] -> [n, d]: every
    row's sum over its experts, where expert j lives on rank ``j // experts_per_rank``.
    ``compute(rows, weights, experts)`` is this rank's part: for the rows it received, their sum
    over the experts it holds (pairs of other ranks' experts add nothing)."""
    n, k = experts.shape
    to = torch.zeros(n, T, dtype=torch.bool, device=x.device)
    to.scatter_(1, experts // experts_per_rank, True)
    _, rows = to.t().nonzero(as_tuple=True)  # rank-major: the rows for rank 0, then rank 1 ...
    sends = to.sum(0)
    receives = torch.empty_like(sends)
    collectives.all_to_all(receives, sends, [1] * T, [1] * T)
    send, receive = sends.tolist(), receives.tolist()  # the split sizes, on the host
    payload = pack_rows([x.index_select(0, rows), experts.index_select(0, rows).to(torch.int32),
                         weights.index_select(0, rows).float()])
    arrived = payload.new_empty(sum(receive), payload.shape[1])
    collectives.all_to_all(arrived, payload, receive, send)
    their_x, their_experts, their_weights = unpack_rows(arrived, [(x.dtype, x.shape[1]), (torch.int32, k),
                                                                  (torch.float32, k)])
    partial = compute(their_x, their_weights, their_experts.long())
    back = partial.new_empty(rows.shape[0], x.shape[1])
    collectives.all_to_all(back, partial.contiguous(), send, receive)
    return torch.zeros_like(x).index_add_(0, rows, back)
