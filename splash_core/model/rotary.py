"""Rotary position embedding of MLA's rotary channels: plain RoPE or YaRN-scaled (DeepSeek).

The runtime rotates the first and second halves of the rotary channels (Hugging Face's
``rotate_half`` convention); checkpoints that interleave the pairs are permuted into this order
at load (:mod:`splash_core.checkpoint.source`). YaRN (``ModelProfile.rope_scaling``) changes
three things, exactly as DeepSeek's reference code and transformers do:

- frequencies: ``inv_freq = interp (1 - m) + extrap m`` with ``extrap = θ^(-2i/d)``,
  ``interp = extrap / factor`` and ``m = 1 - ramp(i)``, the ramp rising from 0 to 1 between
  the dims where ``beta_fast`` and ``beta_slow`` rotations fit the original context (rounded
  down and up to whole dims);
- cos and sin are multiplied by ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``;
- the softmax scale ``1/sqrt(d_n + d_r)`` is multiplied by ``mscale(factor, mscale_all_dim)²``,

where ``mscale(s, m) = 0.1 m ln s + 1`` (1 when s <= 1 or m = 0).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..profiles.model import ModelProfile, RopeScaling


def mscale(factor: float, m: float) -> float:
    return 1.0 if factor <= 1 or not m else 0.1 * m * math.log(factor) + 1.0


def frequencies(dim: int, theta: float, scaling: RopeScaling | None, device=None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [dim/2] float32, cos/sin scale) of the rotary channels."""
    base = theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    if scaling is None:
        return 1.0 / base, 1.0
    s = scaling

    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), dim - 1)
    ramp = (torch.arange(dim // 2, device=device, dtype=torch.float32) - low) / ((high - low) or 0.001)
    extrapolated = 1 - ramp.clamp(0, 1)
    inv_freq = (1.0 / (s.factor * base)) * (1 - extrapolated) + (1.0 / base) * extrapolated
    return inv_freq, mscale(s.factor, s.mscale) / mscale(s.factor, s.mscale_all_dim)


def softmax_scale(profile: ModelProfile) -> float:
    """MLA's softmax scale: 1/sqrt(d_n + d_r), with YaRN's correction."""
    m = profile.mla
    scale = 1.0 / math.sqrt(m.qk_nope_head_dim + m.qk_rope_head_dim)
    s = profile.rope_scaling
    return scale if s is None else scale * mscale(s.factor, s.mscale_all_dim) ** 2


@dataclasses.dataclass(frozen=True)
class Rotary:
    """RoPE of n positions: ``cos`` = [cos a, cos a] and ``sin`` = [-sin a, sin a] (times YaRN's
    scale), [n, d_r] float32.

    Computed once per step (every layer rotates the same positions) and applied to any rows
    [n, ..., d_r] of those positions as ``x cos + swap_halves(x) sin``: element for element the
    rotate-half formula ``x1 cos - x2 sin, x2 cos + x1 sin`` in float32, so the result is the same
    to the bit as rotating with the angles recomputed."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def at(cls, positions: torch.Tensor, dim: int, theta: float, scaling: RopeScaling | None = None) -> "Rotary":
        inv_freq, scale = frequencies(dim, theta, scaling, positions.device)
        angles = positions.float()[:, None] * inv_freq[None, :]  # [n, d/2]
        cos, sin = angles.cos(), angles.sin()
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        return cls(torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1))

    @classmethod
    def identity(cls, n: int, dim: int, device=None) -> "Rotary":
        """No rotation of n rows (cos 1, sin 0: ``x cos + swap(x) sin`` is ``x`` exactly), for MLA
        without position encoding."""
        return cls(torch.ones(n, dim, device=device), torch.zeros(n, dim, device=device))

    def rows(self, index) -> "Rotary":
        """The rotation of a subset of the rows (a slice keeps views)."""
        return Rotary(self.cos[index], self.sin[index])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [n, ..., d_r] rotated, in its own dtype."""
        half = x.shape[-1] // 2
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
        return (x * self.cos.view(shape) + swapped * self.sin.view(shape)).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Rotate ``x`` [n, ..., d_r] by ``positions`` [n] (rotate-half convention)."""
    return Rotary.at(positions, x.shape[-1], theta, scaling)(x)
