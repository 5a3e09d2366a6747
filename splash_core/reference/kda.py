"""Torch reference of the KDA kernels: the token-by-token gated delta rule, in float32."""

from __future__ import annotations

import torch


def recurrent(q, k, v, g, beta, state, scale):
    """o [B, T, H, V] and the final state [B, H, K, V] (see :class:`~splash_core.platform.interfaces.KDAKernels`)."""
    dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    s = state.float().clone()
    out = torch.empty_like(v)
    for t in range(q.shape[1]):
        s = s * g[:, t].exp()[..., None]
        kt = k[:, t]
        delta = v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, s)
        s = s + torch.einsum("bhk,bhv->bhkv", beta[:, t][..., None] * kt, delta)
        out[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, s)
    return out.to(dtype), s
