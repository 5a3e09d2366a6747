"""Routed experts, layout-free: DeepSeek's router and a grouped (batched) expert computation.

:func:`route` is the router of DeepSeek-V2/V3 (``ModelProfile.moe``), computed in float32 as
DeepSeek does: scores (softmax or sigmoid of ``x Wᵀ``); for ``noaux_tc`` the choice adds
``e_score_correction_bias``; for ``group_limited_greedy`` / ``noaux_tc`` only the ``topk_group``
best of ``n_group`` groups (ranked by their best score / their top-2 sum) may be chosen; the top
``num_experts_per_tok`` experts by choice; their weights are the *scores* (without the bias),
renormalised to sum to 1 if ``norm_topk_prob``, times ``routed_scaling_factor``.

:func:`expert_outputs` applies the experts one rank holds to the (row, expert) pairs routed to
them without a Python loop over experts: pairs are sorted by expert and each of the two
projections is one grouped matmul (``torch._grouped_mm`` where the device and format support it,
else one batched matmul over groups padded to the largest), so a step issues the same few kernels
however the tokens are routed.
"""

from __future__ import annotations

import torch

from ..profiles.model import MoEConfig
from .ops import silu_mul as reference_silu_mul

_GROUPED_MM: dict = {}  # (device type, dtype) -> whether torch._grouped_mm ran there


def route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
          moe: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [n, k] float32, experts [n, k] int64) of rows ``x`` [n, d] for router ``weight``
    [E, d] (and ``bias`` [E] for noaux_tc)."""
    logits = x.float() @ weight.float().t()
    scores = logits.sigmoid() if moe.scoring_func == "sigmoid" else logits.softmax(dim=-1)
    choice = scores + bias.float() if moe.topk_method == "noaux_tc" and bias is not None else scores
    if moe.topk_method != "greedy" and moe.n_group > 1:
        grouped = choice.view(x.shape[0], moe.n_group, moe.n_routed_experts // moe.n_group)
        rank_by = grouped.topk(2, dim=-1).values.sum(-1) if moe.topk_method == "noaux_tc" else grouped.amax(-1)
        keep = torch.zeros_like(rank_by, dtype=torch.bool).scatter_(1, rank_by.topk(moe.topk_group, dim=-1).indices, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(x.shape[0], moe.n_routed_experts)
    experts = choice.topk(moe.num_experts_per_tok, dim=-1).indices
    weights = scores.gather(1, experts)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling_factor, experts


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``x`` [P, in] (rows sorted by group) through ``weight`` [G, out, in]: group g's ``counts[g]``
    rows through ``weight[g]``. Rows past ``counts.sum()`` come back undefined."""
    key = (x.device.type, x.dtype)
    if _GROUPED_MM.get(key, hasattr(torch, "_grouped_mm")):
        try:
            out = torch._grouped_mm(x, weight.transpose(1, 2), offs=torch.cumsum(counts, 0).to(torch.int32))
            _GROUPED_MM[key] = True
            return out
        except (RuntimeError, NotImplementedError):  # not for this device or format: batched matmul
            _GROUPED_MM[key] = False
    return padded_linear(x, weight, counts)


def padded_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """:func:`grouped_linear` as one batched matmul over groups padded to the largest (reads the
    largest count back to the host)."""
    groups, total = weight.shape[0], int(counts.sum())
    width = int(counts.max()) if groups else 0
    group = torch.repeat_interleave(torch.arange(groups, device=x.device), counts)
    slot = torch.arange(total, device=x.device) - (torch.cumsum(counts, 0) - counts)[group]
    padded = x.new_zeros(groups, width, x.shape[1])
    padded[group, slot] = x[:total]
    out = x.new_zeros(x.shape[0], weight.shape[1])
    out[:total] = torch.bmm(padded, weight.transpose(1, 2))[group, slot]
    return out


def expert_outputs(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, first: int,
                   gate_up: torch.Tensor, down: torch.Tensor, silu_mul=reference_silu_mul,
                   own_pairs_only: bool = False, linear=None) -> torch.Tensor:
    """Sum over each row's routed pairs of weight x expert(row), for the experts ``first`` ..
    ``first + G - 1`` held here (``gate_up`` [G, 2 I, d], ``down`` [G, d, I]); pairs routed to
    other experts add nothing. [n, d] in ``x``'s dtype. ``silu_mul``: the activation of the
    stacked gate/up output.

    ``own_pairs_only``: build only the pairs routed to the experts held here (their count read back
    to the host once); else every pair, of which the others' are computed and dropped — the
    shapes a captured graph needs, T times the rows a rank of T needs.

    ``linear(x, weight, counts)``: the grouped projection (None: :func:`grouped_linear`; FP8 weights
    kept as stored pass their kernels', with ``gate_up`` and ``down`` then of their kind)."""
    n, k = experts.shape
    held = gate_up.shape[0]
    if held == 0 or n == 0:
        return x.new_zeros(n, x.shape[1])
    local = (experts - first).reshape(-1)
    group = torch.where((local >= 0) & (local < held), local, held)  # pairs of other ranks sort last
    order = torch.argsort(group, stable=True)
    counts = torch.zeros(held + 1, dtype=torch.int64, device=x.device).scatter_add_(
        0, group, torch.ones_like(group))[:held]  # (bincount would read its size back to the host)
    if own_pairs_only:
        order = order[: int(counts.sum())]
    rows = order // k
    linear = linear or grouped_linear
    both = linear(x.index_select(0, rows), gate_up, counts)
    out = linear(silu_mul(both), down, counts)
    mine = (group.index_select(0, order) < held)[:, None]
    # weighted and summed in the compute format, as transformers does: a float32 copy of every
    # routed pair would cost 8 x 4 bytes per hidden channel and token in a long prefill
    scaled = torch.where(mine, out * weights.reshape(-1).index_select(0, order)[:, None].to(out.dtype), 0.0)
    return torch.zeros(n, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, rows, scaled)
