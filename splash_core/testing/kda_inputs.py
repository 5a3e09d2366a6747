"""KDA inputs in the ranges KDA layers produce, shared by the conformance suite and tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kda_inputs(batch, tokens, heads, dim, device, dtype, seed=0):
    """(q, k, v, g, beta, state, scale): unit-norm q and k, log decay in (-inf, 0) near 0,
    beta in (0, 1), a nonzero float32 starting state."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, tokens, heads, dim)
    q = F.normalize(torch.randn(shape, generator=g), dim=-1)
    k = F.normalize(torch.randn(shape, generator=g), dim=-1)
    v = torch.randn(shape, generator=g)
    decay = -F.softplus(torch.randn(shape, generator=g)) / 8
    beta = torch.rand(batch, tokens, heads, generator=g)
    state = torch.randn(batch, heads, dim, dim, generator=g) / 4
    cast = [x.to(device=device, dtype=dtype) for x in (q, k, v, decay, beta)]
    return (*cast, state.to(device), dim ** -0.5)
