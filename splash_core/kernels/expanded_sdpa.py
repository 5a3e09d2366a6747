"""Expanded-form attention (contract: :mod:`.expanded`) on torch's fused scaled-dot-product
attention kernels, the backend kernel chosen by the caller (:func:`dense_attend`).

The rows and keys become dense calls by :func:`.expanded_plan.plan` (a request's history without
mask plus its chunk as a square causal block, merged by log-sum-exp; requests of equal sizes
batched); requests it cannot express go to ``fallback`` (another expanded kernel), rows that see
no key get 0 and -inf. With shape buckets (:mod:`.expanded_buckets`) the calls take few distinct
shapes, so a kernel that builds a graph per shape (cuDNN's) builds them once, in
:meth:`SdpaExpanded.warm_up` before anything is timed (torch keeps cuDNN's graphs per thread: warm
up in the thread that serves). The plan is made on the host: from a caller's host arrays
(:class:`~.expanded_plan.HostIndex`, the runtime's: no copy) or else from the index tensors, one
device-to-host copy per new set (a :class:`~.tensor_memo.TensorMemo` keeps the last plan while the
same tensors come back, as the Triton kernel keeps its launch plan), so this provider is for prefill chunks,
never inside a captured graph.

Keys are [B, H, m, d_n + d_r] copies (the rotary key every head shares is broadcast into each,
as a dense kernel wants one key tensor); unbucketed, queries and values are read in place through
strided views wherever a group's rows or keys are equally spaced runs (as serving gives them),
else gathered; bucketed, every operand is a contiguous padded copy (strides follow from shapes).

Why the private ``torch.ops.aten._scaled_dot_product_*`` ops and not
``torch.nn.functional.scaled_dot_product_attention`` under ``sdpa_kernel``: the merge and the
contract need the log-sum-exp, which the public function does not return. The ops exist with
these signatures in torch 2.5 onwards (read in torch 2.13; the benchmark checks 2.11 on the GPU);
calling one IS pinning its kernel (no silent fallback to another backend). Their log-sum-exp is
natural-log per (batch, head, row); the efficient kernel pads its rows to a multiple of 32.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch.nn.attention import SDPBackend

from . import expanded_plan
from .expanded_buckets import BucketGroup, BucketSizes, bucket, deployment_shapes
from .tensor_memo import TensorMemo

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


def sdpa_expanded_attention(backend: SDPBackend, fallback: Callable, group: bool = True,
                            buckets: BucketSizes | None = None) -> "SdpaExpanded":
    """``fn(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale, host=None) -> (out, lse)`` on
    torch's ``backend``; requests a dense call cannot express go to ``fallback`` (same signature);
    ``group`` off: one call per request (measured against batching by the benchmark); ``buckets``:
    calls of bucketed shapes (:mod:`.expanded_buckets`), else each call its exact shape."""
    return SdpaExpanded(dense_attend(backend), fallback, group, buckets)


class SdpaExpanded:
    """The provider: the contract's call, plus ``host`` (:class:`~.expanded_plan.HostIndex`: the
    index arrays on the host, planned there with no device copy) and :meth:`warm_up`."""

    takes_host_index = True

    def __init__(self, attend: Attend, fallback: Callable, group: bool, buckets: BucketSizes | None):
        self.attend, self.fallback, self.group, self.buckets = attend, fallback, group, buckets
        self.plans = TensorMemo()

    def __call__(self, q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale, host=None):
        return expanded_sdpa(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale, attend=self.attend,
                             fallback=self.fallback, group=self.group, plans=self.plans, buckets=self.buckets,
                             host=host)

    def warm_up(self, heads: int, widths: tuple[int, int, int], dtype, device, max_rows: int, max_context: int,
                max_batch: int = 1) -> int:
        """Run every bucketed call shape a deployment can produce once (:func:`deployment_shapes`),
        on zeros of ``heads`` heads and ``widths`` (d_n, d_r, d_v), so a kernel that builds a graph
        per shape builds them before anything is timed; the number of shapes run (0 unbucketed)."""
        if self.buckets is None:
            return 0
        shapes = deployment_shapes(self.buckets, max_rows, max_context, max_batch)
        d_n, d_r, d_v = widths
        for batch, q_len, k_len, causal in shapes:
            q = torch.zeros(batch, q_len, heads, d_n + d_r, dtype=dtype, device=device).transpose(1, 2)
            k = torch.zeros(batch, k_len, heads, d_n + d_r, dtype=dtype, device=device).transpose(1, 2)
            v = torch.zeros(batch, k_len, heads, d_v, dtype=dtype, device=device).transpose(1, 2)
            self.attend(q, k, v, causal, (d_n + d_r) ** -0.5)
        return len(shapes)


def host_plan(q_req, q_pos, k_start, k_pos, group: bool = True, buckets: BucketSizes | None = None):
    """The plan of device index tensors: one device-to-host copy, then :func:`make_plan`."""
    sizes = [t.numel() for t in (q_req, q_pos, k_start, k_pos)]
    host = torch.cat([t.reshape(-1).to(torch.int64) for t in (q_req, q_pos, k_start, k_pos)]).cpu().numpy()
    return make_plan(*np.split(host, np.cumsum(sizes)[:-1]), group=group, buckets=buckets)


def make_plan(q_req, q_pos, k_start, k_pos, group: bool = True, buckets: BucketSizes | None = None):
    """:func:`expanded_plan.plan` of host arrays, bucketed by ``buckets`` where given."""
    dense = expanded_plan.plan(q_req, q_pos, k_start, k_pos, group=group)
    return dense if buckets is None else bucket(dense, buckets)


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


def _merge(parts):
    """Parts' (out, lse) over disjoint keys, every row seeing a key in each, merged in float32."""
    if len(parts) == 1:
        return parts[0]
    lse = torch.logsumexp(torch.stack([part_lse for _, part_lse in parts]), dim=0)
    out = sum(part_out.float() * torch.exp(part_lse - lse)[..., None] for part_out, part_lse in parts)
    return out.to(parts[0][0].dtype), lse


def _flat(out, lse):
    """[B, H, n, d_v], [B, H, n] -> [B*n, H, d_v], [B*n, H]."""
    batch, heads, n, d_v = out.shape
    return out.transpose(1, 2).reshape(batch * n, heads, d_v), lse.transpose(1, 2).reshape(batch * n, heads)


def _attend_group(g: expanded_plan.DenseGroup, q, k_nope, k_rope, v, scale: float, attend: Attend):
    """(out [B*n, H, d_v], lse [B*n, H]) of one group's rows, in ``g.rows`` order."""
    qg = _view(q, g.rows).transpose(1, 2)  # [B, H, n, d]
    parts = []
    if g.history.shape[1]:
        parts.append(attend(qg, *_keys(k_nope, k_rope, v, g.history), False, scale))
    if g.chunk.shape[1]:
        parts.append(attend(qg, *_keys(k_nope, k_rope, v, g.chunk), True, scale))
    return _flat(*_merge(parts))


def _slots(t: torch.Tensor, index: np.ndarray, front: int, length: int) -> torch.Tensor:
    """A contiguous [b, length, ...] holding ``t[index]`` at slots ``front .. front + m - 1``, zeros elsewhere:
    ``t``'s own rows where they fill it and lie in it as a copy would (the same strides, so the same
    cuDNN graph), else a copy."""
    b, m = index.shape
    full = front == 0 and m == length
    if full and t.is_contiguous():
        spaced = expanded_plan.affine(index)
        if spaced is not None and (b == 1 or spaced[1] == m):
            return _view(t, index)
    out = (t.new_empty if full else t.new_zeros)(b, length, *t.shape[1:])
    out[:, front:front + m] = _view(t, index)
    return out


def _key_slots(k_nope, k_rope, v, index: np.ndarray, length: int):
    """Keys [b, H, length, d_n + d_r] and values [b, H, length, d_v], ``index``'s first, zeros after."""
    b, m = index.shape
    d_n = k_nope.shape[2]
    full = m == length
    keys = (k_nope.new_empty if full else k_nope.new_zeros)(b, length, k_nope.shape[1], d_n + k_rope.shape[1])
    keys[:, :m, :, :d_n] = _view(k_nope, index)
    keys[:, :m, :, d_n:] = _view(k_rope, index)[:, :, None, :]
    return keys.transpose(1, 2), _slots(v, index, 0, length).transpose(1, 2)


def _attend_bucketed(g: BucketGroup, q, k_nope, k_rope, v, scale: float, attend: Attend):
    """:func:`_attend_group` by the bucketed calls of :mod:`.expanded_buckets`."""
    n = g.rows.shape[1]
    queries, parts = {}, []
    for call in g.calls:
        where = (call.front, call.q_len)
        if where not in queries:  # the history pieces share one padded query buffer
            queries[where] = _slots(q, g.rows, call.front, call.q_len).transpose(1, 2)
        out, lse = attend(queries[where], *_key_slots(k_nope, k_rope, v, call.keys, call.k_len), call.causal, scale)
        parts.append((out[:, :, call.front:call.front + n], lse[:, :, call.front:call.front + n]))
    return _flat(*_merge(parts))


def expanded_sdpa(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale, *, attend: Attend,
                  fallback: Callable, group: bool = True, plans: TensorMemo | None = None,
                  buckets: BucketSizes | None = None, host: expanded_plan.HostIndex | None = None):
    """Expanded attention (contract: :mod:`.expanded`) by dense ``attend`` calls (of bucketed
    shapes where ``buckets`` is given), ``fallback`` for the requests they cannot express. The
    plan: from ``host`` where given (no device copy), else from the index tensors through
    ``plans`` (None: plan every call)."""
    n, heads = q.shape[:2]
    if host is not None:
        p = host.memo(("sdpa", group, buckets), lambda: make_plan(host.q_req, host.q_pos, host.k_start, host.k_pos,
                                                                  group=group, buckets=buckets))
    elif plans is not None:
        p = plans.get((q_req, q_pos, k_start, k_pos), (group, buckets),
                      lambda: host_plan(q_req, q_pos, k_start, k_pos, group, buckets))
    else:
        p = host_plan(q_req, q_pos, k_start, k_pos, group, buckets)
    run = _attend_bucketed if buckets is not None else _attend_group
    everything = len(p.groups) == 1 and p.groups[0].rows.size == n and np.array_equal(p.groups[0].rows.ravel(),
                                                                                         np.arange(n))
    if everything:  # one call, rows already in order: its result is the answer
        return run(p.groups[0], q, k_nope, k_rope, v, scale, attend)
    out = q.new_empty(n, heads, v.shape[2])
    lse = torch.empty(n, heads, dtype=torch.float32, device=q.device)
    for g in p.groups:
        rows = torch.as_tensor(g.rows.ravel(), device=q.device)
        o, s = run(g, q, k_nope, k_rope, v, scale, attend)
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
