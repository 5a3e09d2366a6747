"""KV residency sampler of appendix B ("Residency assumptions"): the longest nominal input
length L each layout keeps resident for random cohorts of B requests on T ranks.

A cohort draws, per request, an input uniformly from the integers in [⌊f·L⌋, L] (f = 1/2 in
the paper) and an output uniformly from the integers in [o_min, o_max]; the whole input plus
the requested output is reserved. Per layout, with ``pool`` the tokens one rank can hold:

- TP replicates every history: the cohort fits when Σ tokens ≤ pool.
- CP balances stored tokens ideally over the T ranks: ⌈Σ tokens / T⌉ ≤ pool.
- DP and DOP give request b to owner b mod T (count-balanced, length-blind round robin):
  the cohort fits when every owner's Σ tokens ≤ pool.

The limit is the largest integer L at which at least ``target`` of the cohorts fit on every
rank. Draws are common random numbers: uniforms u and outputs are drawn once (PCG64, the
scenario's seed) and input b of a cohort is ⌊f·L⌋ + ⌊u_b · (L − ⌊f·L⌋ + 1)⌋, an exactly uniform
integer in the range for every L. Inputs are then non-decreasing in L, so the fit fraction is
non-increasing and bisection finds the exact limit for these draws.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..layouts import Layout, Ownership


@dataclasses.dataclass(frozen=True)
class Cohorts:
    """Random draws shared by every layout and every L: uniforms [N, B] and outputs [N, B]."""

    uniforms: np.ndarray
    outputs: np.ndarray
    input_low_fraction: float

    @property
    def count(self) -> int:
        return self.uniforms.shape[0]

    @property
    def batch(self) -> int:
        return self.uniforms.shape[1]

    def inputs(self, tokens: int) -> np.ndarray:
        """Input lengths [N, B] at nominal length L = ``tokens``."""
        low = math.floor(self.input_low_fraction * tokens)
        span = tokens - low + 1
        return low + np.floor(self.uniforms * span).astype(np.int64)


def draw_cohorts(count: int, batch: int, seed: int, output_range: tuple[int, int],
                 input_low_fraction: float = 0.5) -> Cohorts:
    """``count`` cohorts of ``batch`` requests from PCG64(seed): uniforms first, then outputs."""
    rng = np.random.Generator(np.random.PCG64(seed))
    uniforms = rng.random((count, batch))
    outputs = rng.integers(output_range[0], output_range[1], size=(count, batch), endpoint=True)
    return Cohorts(uniforms, outputs.astype(np.int64), input_low_fraction)


def rank_need(layout: Layout, tokens_per_request: np.ndarray, T: int) -> np.ndarray:
    """Tokens the busiest rank must hold for each cohort [N] under ``layout``.

    ``tokens_per_request`` is [N, B]; request b of every cohort is owned by rank b mod T."""
    total = tokens_per_request.sum(axis=1)
    if layout.ownership is Ownership.ALL:
        return total
    if layout.ownership is Ownership.POSITIONS:
        return -(-total // T)
    n, b = tokens_per_request.shape
    padded = np.zeros((n, -(-b // T) * T), dtype=tokens_per_request.dtype)
    padded[:, :b] = tokens_per_request
    return padded.reshape(n, -1, T).sum(axis=1).max(axis=1)


def fit_fraction(layout: Layout, pool: int, tokens: int, cohorts: Cohorts, T: int) -> float:
    """Fraction of cohorts whose whole input + output fits on every rank at nominal length L."""
    need = rank_need(layout, cohorts.inputs(tokens) + cohorts.outputs, T)
    return float(np.count_nonzero(need <= pool)) / cohorts.count


def _estimate(layout: Layout, pool: int, cohorts: Cohorts, T: int, target: float) -> float:
    """A continuous estimate of the limit, within a few tokens per request of the exact one.

    With input ≈ f·L + u·((1 − f)·L + 1), each rank's need is linear in L, so each cohort has
    a largest fitting L in closed form; the limit is their (1 − target) quantile."""
    f = cohorts.input_low_fraction
    u, out = cohorts.uniforms, cohorts.outputs.astype(np.float64)
    slope_parts = f + u * (1.0 - f)  # d(input)/dL per request
    offset_parts = u + out  # input + output at L = 0
    slope = _rank_sums(layout, slope_parts, T)
    offset = _rank_sums(layout, offset_parts, T)
    room = pool * T if layout.ownership is Ownership.POSITIONS else pool  # CP: Σ ≤ T·pool
    with np.errstate(divide="ignore"):
        per_cohort = np.min((room - offset) / slope, axis=1)
    return float(np.quantile(per_cohort, 1.0 - target))


def _rank_sums(layout: Layout, parts: np.ndarray, T: int) -> np.ndarray:
    """Per-rank sums [N, ranks] of per-request terms (TP and CP: one column, the total)."""
    if layout.ownership in (Ownership.ALL, Ownership.POSITIONS):
        return parts.sum(axis=1, keepdims=True)
    n, b = parts.shape
    padded = np.zeros((n, -(-b // T) * T))
    padded[:, :b] = parts
    return padded.reshape(n, -1, T).sum(axis=1)


def residency_limit(layout: Layout, pool: int, cohorts: Cohorts, T: int, target: float = 0.99,
                    search_max: int = 1 << 24) -> int:
    """Largest integer L in [1, search_max] at which ≥ ``target`` of the cohorts fit (0: none).

    Bisection over an exact bracket found around the closed-form estimate."""
    def fits(tokens: int) -> bool:
        return fit_fraction(layout, pool, tokens, cohorts, T) >= target

    if not fits(1):
        return 0
    guess = int(min(max(_estimate(layout, pool, cohorts, T, target), 1), search_max))
    step = 4 * cohorts.batch + 16
    lo, hi = max(1, guess - step), min(search_max, guess + step)
    while lo > 1 and not fits(lo):
        lo, step = max(1, lo - step), step * 2
    while hi < search_max and fits(hi):
        hi, step = min(search_max, hi + step), step * 2
    if fits(hi):
        return hi
    while hi - lo > 1:  # invariant: fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclasses.dataclass(frozen=True)
class LayoutLimit:
    """One layout's KV limit in a scenario: ``tokens`` is None when no memory is given for it;
    ``source`` says whether it was ``sampled`` here or ``prescribed`` by the scenario."""

    layout: Layout
    tokens: int | None
    pool: int | None
    source: str


def scenario_limits(spec, layouts=tuple(Layout)) -> dict[Layout, LayoutLimit]:
    """Every layout's limit for a scenario's capacity spec (profiles.scenario.CapacitySpec):
    prescribed limits as given, the others sampled from one shared set of cohorts."""
    cohorts = None
    out = {}
    for layout in layouts:
        pool = spec.pool(layout)
        if layout in spec.prescribed_limits_tokens:
            out[layout] = LayoutLimit(layout, int(spec.prescribed_limits_tokens[layout]), pool, "prescribed")
        elif pool is None:
            out[layout] = LayoutLimit(layout, None, None, "none")
        else:
            if cohorts is None:
                cohorts = draw_cohorts(spec.cohorts, spec.batch, spec.seed, tuple(spec.output_tokens),
                                       spec.input_low_fraction)
            tokens = residency_limit(layout, pool, cohorts, spec.T, spec.target, spec.search_max_tokens)
            out[layout] = LayoutLimit(layout, tokens, pool, "sampled")
    return out
