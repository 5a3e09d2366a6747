"""How close each row's expert routing came to another choice, and that other choice.

Routing is a discrete decision: where the router's k-th and (k+1)-th candidates (or, with
grouped top-k, the last kept and the first dropped group) nearly tie, a run in a lower-precision
format may route the row the other way, which moves its output by O(1), far beyond the format's
continuous rounding error. The reference check uses :func:`near_tie` to recognise such a row
(its margin within the measured error of the router's scores) and to score the row with the
decision taken the other way (:class:`~splash_core.runtime.reference_model.ReferenceModel`'s
``flip``). The decisions mirror :func:`~splash_core.model.experts.route`.
"""

from __future__ import annotations

import torch

from ..profiles.model import MoEConfig


def router_scores(x: torch.Tensor, weight: torch.Tensor, moe: MoEConfig) -> torch.Tensor:
    """The router's scores [n, E] float32 of rows ``x`` (sigmoid or softmax of the logits)."""
    logits = x.float() @ weight.float().t()
    return logits.sigmoid() if moe.scoring_func == "sigmoid" else logits.softmax(dim=-1)


def near_tie(scores: torch.Tensor, bias: torch.Tensor | None,
             moe: MoEConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(margin [n], weights [n, k], experts [n, k]): each row's smallest gap between a routing
    choice made and one not made (inf when there is no other choice), and the routing with that
    closest decision taken the other way (weights as :func:`route` gives them)."""
    n, k = scores.shape[0], moe.num_experts_per_tok
    choice = scores + bias.float() if moe.topk_method == "noaux_tc" and bias is not None else scores
    inf = torch.full((n,), float("inf"), device=scores.device)
    kept = choice
    group_margin, other_groups = inf, choice
    if moe.topk_method != "greedy" and moe.n_group > 1:
        grouped = choice.view(n, moe.n_group, -1)
        rank_by = grouped.topk(2, dim=-1).values.sum(-1) if moe.topk_method == "noaux_tc" else grouped.amax(-1)
        order = rank_by.sort(dim=-1, descending=True)
        keep = torch.zeros_like(rank_by, dtype=torch.bool).scatter_(1, order.indices[:, :moe.topk_group], True)
        kept = grouped.masked_fill(~keep[..., None], float("-inf")).view(n, -1)
        if moe.topk_group < moe.n_group:
            last, first_out = order.indices[:, moe.topk_group - 1: moe.topk_group + 1].unbind(1)
            group_margin = order.values[:, moe.topk_group - 1] - order.values[:, moe.topk_group]
            swapped = keep.scatter(1, last[:, None], False).scatter(1, first_out[:, None], True)
            other_groups = grouped.masked_fill(~swapped[..., None], float("-inf")).view(n, -1)
    if kept.shape[1] > k:
        top = kept.topk(k + 1, dim=-1)
        expert_margin = torch.where(torch.isfinite(top.values[:, k]), top.values[:, k - 1] - top.values[:, k], inf)
        swapped_expert = top.indices[:, :k].clone()
        swapped_expert[:, k - 1] = top.indices[:, k]  # the weakest chosen expert for the strongest left out
    else:
        expert_margin, swapped_expert = inf, kept.topk(k, dim=-1).indices
    by_group = group_margin < expert_margin
    experts = torch.where(by_group[:, None], other_groups.topk(k, dim=-1).indices, swapped_expert)
    return torch.minimum(group_margin, expert_margin), routed_weights(scores, experts, moe), experts


def routed_weights(scores: torch.Tensor, experts: torch.Tensor, moe: MoEConfig) -> torch.Tensor:
    """The weights [n, k] float32 :func:`route` gives rows with router ``scores`` sent to ``experts``."""
    weights = scores.gather(1, experts)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling_factor
