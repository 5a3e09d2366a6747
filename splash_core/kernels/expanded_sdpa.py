"""Expanded-form attention (contract: :mod:`.expanded`) on torch's fused scaled-dot-product
attention kernels, the backend kernel chosen by the caller (:func:`dense_attend`).

The rows and keys become dense calls by :func:`.expanded_plan.plan` (a request's history without
mask plus its chunk as a square causal block, merged by log-sum-exp; requests of equal sizes
batched); requests it cannot express go to ``fallback`` (another expanded kernel), rows that see
no key get 0 and -inf. The plan needs the index tensors on the host: one device-to-host copy per
new set of index tensors (:class:`DensePlanCache` keeps the last plan while the same tensors come
back, as the Triton kernel keeps its launch plan), so this provider is for prefill chunks, never
inside a captured graph.

Keys are [B, H, m, d_n + d_r] copies (the rotary key every head shares is broadcast into each,
as a dense kernel wants one key tensor); queries and values are read in place through strided
views wherever a group's rows or keys are equally spaced runs (as serving gives them), else
gathered.

Why the private ``torch.ops.aten._scaled_dot_product_*`` ops and not
``torch.nn.functional.scaled_dot_product_attention`` under ``sdpa_kernel``: the merge and the
contract need the log-sum-exp, which the public function does not return. The ops exist with
these signatures in torch 2.5 onwards (read in torch 2.13; the benchmark checks 2.11 on the GPU);
calling one IS pinning its kernel (no silent fallback to another backend). Their log-sum-exp is
natural-log per (batch, head, row); the efficient kernel pads its rows to a multiple of 32.
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable

import numpy as np
import torch
from torch.nn.attention import SDPBackend

from . import expanded_plan

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool, float], tuple[torch.Tensor, torch.Tensor]]


def math_attend(q, k, v, causal: bool, scale: float):
    """Plain torch in float32 (the math backend's algorithm, plus the log-sum-exp): ``q`` [B, H,
    n, d], ``k`` [B, H, m, d], ``v`` [B, H, m, d_v] -> (out [B, H, n, d_v] in q's dtype, lse [B, H, n])."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if causal:  # square: row i sees keys 0..i
        hidden = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v.float()).to(q.dtype), lse


def _fused_cudnn(q, k, v, causal: bool, scale: float):
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False,
                                                                   scale=scale)[:2]
    return out, lse.reshape(q.shape[:3]).float()


def _fused_efficient(q, k, v, causal: bool, scale: float):
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal,
                                                                       scale=scale)[:2]
    return out, lse[..., :q.shape[2]].float()


_ATTEND = {SDPBackend.MATH: math_attend, SDPBackend.CUDNN_ATTENTION: _fused_cudnn,
           SDPBackend.EFFICIENT_ATTENTION: _fused_efficient}


def dense_attend(backend: SDPBackend) -> Attend:
    """The dense attention of torch's ``backend`` that returns its log-sum-exp."""
    if backend not in _ATTEND:
        raise ValueError(f"no log-sum-exp-returning dense attention for SDP backend {backend.name} "
                         f"(have: {', '.join(b.name for b in _ATTEND)})")
    return _ATTEND[backend]


def sdpa_expanded_attention(backend: SDPBackend, fallback: Callable, group: bool = True):
    """``fn(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale) -> (out, lse)`` on torch's
    ``backend``; requests a dense call cannot express go to ``fallback`` (same signature);
    ``group`` off: one call per request (measured against batching by the benchmark)."""
    return functools.partial(expanded_sdpa, attend=dense_attend(backend), fallback=fallback, group=group,
                             plans=DensePlanCache())


class DensePlanCache:
    """The last dense plan, reused while the same index tensors come back unchanged (identity by
    weak reference, torch's in-place version counters), so repeated calls skip the host copy."""

    def __init__(self):
        self._key, self._refs, self._value = None, (), None

    def get(self, q_req, q_pos, k_start, k_pos, group: bool) -> expanded_plan.DensePlan:
        tensors = (q_req, q_pos, k_start, k_pos)
        key = (tuple(t._version for t in tensors), group)
        if self._key != key or len(self._refs) != 4 or any(r() is not t for r, t in zip(self._refs, tensors)):
            self._value = host_plan(*tensors, group=group)
            self._refs, self._key = tuple(weakref.ref(t) for t in tensors), key
        return self._value


def host_plan(q_req, q_pos, k_start, k_pos, group: bool = True) -> expanded_plan.DensePlan:
    """The dense plan of device index tensors: one device-to-host copy, then :func:`expanded_plan.plan`."""
    sizes = [t.numel() for t in (q_req, q_pos, k_start, k_pos)]
    host = torch.cat([t.reshape(-1).to(torch.int64) for t in (q_req, q_pos, k_start, k_pos)]).cpu().numpy()
    return expanded_plan.plan(*np.split(host, np.cumsum(sizes)[:-1]), group=group)


def _view(t: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """``t[index]`` ([B, m, ...] from [M, ...]) as a strided view where ``index`` allows, else gathered."""
    spaced = expanded_plan.affine(index)
    if spaced is None:
        return t[torch.as_tensor(index, device=t.device)]
    first, step = spaced
    return t.as_strided((*index.shape, *t.shape[1:]), (step * t.stride(0), *t.stride()),
                        t.storage_offset() + first * t.stride(0))


def _keys(k_nope, k_rope, v, index: np.ndarray):
    """Keys [B, H, m, d_n + d_r] (the rotary key broadcast to every head) and values [B, H, m, d_v]."""
    nope = _view(k_nope, index)
    rope = _view(k_rope, index)[:, :, None, :].expand(*nope.shape[:3], k_rope.shape[1])
    return torch.cat([nope, rope], dim=-1).transpose(1, 2), _view(v, index).transpose(1, 2)


def _merge(first, second):
    """Two parts' (out, lse) over disjoint keys, every row seeing a key in each."""
    (o1, l1), (o2, l2) = first, second
    lse = torch.logaddexp(l1, l2)
    out = o1.float() * torch.exp(l1 - lse)[..., None] + o2.float() * torch.exp(l2 - lse)[..., None]
    return out.to(o1.dtype), lse


def _attend_group(g: expanded_plan.DenseGroup, q, k_nope, k_rope, v, scale: float, attend: Attend):
    """(out [B*n, H, d_v], lse [B*n, H]) of one group's rows, in ``g.rows`` order."""
    qg = _view(q, g.rows).transpose(1, 2)  # [B, H, n, d]
    parts = []
    if g.history.shape[1]:
        parts.append(attend(qg, *_keys(k_nope, k_rope, v, g.history), False, scale))
    if g.chunk.shape[1]:
        parts.append(attend(qg, *_keys(k_nope, k_rope, v, g.chunk), True, scale))
    out, lse = parts[0] if len(parts) == 1 else _merge(*parts)
    batch, heads, n, d_v = out.shape
    return out.transpose(1, 2).reshape(batch * n, heads, d_v), lse.transpose(1, 2).reshape(batch * n, heads)


def expanded_sdpa(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale, *, attend: Attend,
                  fallback: Callable, group: bool = True, plans: DensePlanCache | None = None):
    """Expanded attention (contract: :mod:`.expanded`) by dense ``attend`` calls, ``fallback``
    for the requests they cannot express; ``plans`` keeps the last plan (None: plan every call)."""
    n, heads = q.shape[:2]
    p = (plans.get(q_req, q_pos, k_start, k_pos, group) if plans is not None
         else host_plan(q_req, q_pos, k_start, k_pos, group))
    everything = len(p.groups) == 1 and p.groups[0].rows.size == n and np.array_equal(p.groups[0].rows.ravel(),
                                                                                         np.arange(n))
    if everything:  # one call, rows already in order: its result is the answer
        return _attend_group(p.groups[0], q, k_nope, k_rope, v, scale, attend)
    out = q.new_empty(n, heads, v.shape[2])
    lse = torch.empty(n, heads, dtype=torch.float32, device=q.device)
    for g in p.groups:
        rows = torch.as_tensor(g.rows.ravel(), device=q.device)
        o, s = _attend_group(g, q, k_nope, k_rope, v, scale, attend)
        out.index_copy_(0, rows, o)
        lse.index_copy_(0, rows, s)
    if p.fallback_rows.size:
        rows = torch.as_tensor(p.fallback_rows, device=q.device)
        o, s = fallback(q[rows], k_nope, k_rope, v, q_req[rows], q_pos[rows], k_start, k_pos, scale)
        out.index_copy_(0, rows, o)
        lse.index_copy_(0, rows, s)
    if p.empty_rows.size:
        rows = torch.as_tensor(p.empty_rows, device=q.device)
        out.index_fill_(0, rows, 0)
        lse.index_fill_(0, rows, float("-inf"))
    return out, lse
