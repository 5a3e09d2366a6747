"""The KV residency sampler (appendix B) against a brute-force loop on small cohorts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from splash_core.layouts import Layout, pool_from_budget
from splash_core.studies.capacity import draw_cohorts, fit_fraction, residency_limit

GIB = 1 << 30


def brute_force_fits(layout: Layout, pool: int, tokens: int, cohorts, T: int) -> float:
    """One cohort and one rank at a time, straight from appendix B's wording."""
    fits = 0
    low = math.floor(cohorts.input_low_fraction * tokens)
    for c in range(cohorts.count):
        per_rank = [0] * T
        total = 0
        for b in range(cohorts.batch):
            inp = low + int(cohorts.uniforms[c, b] * (tokens - low + 1))
            need = inp + int(cohorts.outputs[c, b])
            total += need
            per_rank[b % T] += need  # count-balanced, length-blind round-robin owners
        if layout is Layout.TP:
            ok = total <= pool  # replicated
        elif layout is Layout.CP:
            ok = math.ceil(total / T) <= pool  # ideal token balance
        else:
            ok = max(per_rank) <= pool
        fits += ok
    return fits / cohorts.count


@pytest.mark.parametrize("batch,T", [(5, 2), (6, 4), (8, 8)])
def test_vectorised_fit_fraction_matches_a_loop(batch, T):
    cohorts = draw_cohorts(300, batch, seed=11, output_range=(512, 1024))
    pool = 40_000
    for layout in Layout:
        for tokens in (2_000, 9_000, 15_000, 40_000):
            assert fit_fraction(layout, pool, tokens, cohorts, T) == brute_force_fits(layout, pool, tokens, cohorts, T)


@pytest.mark.parametrize("layout", list(Layout))
def test_limit_is_the_largest_length_meeting_the_target(layout):
    cohorts = draw_cohorts(400, 6, seed=3, output_range=(64, 128))
    T, pool, target = 4, 9_000, 0.9
    limit = residency_limit(layout, pool, cohorts, T, target)
    assert brute_force_fits(layout, pool, limit, cohorts, T) >= target
    for beyond in (limit + 1, limit + 2, limit + 7):  # non-increasing: nothing longer passes
        assert brute_force_fits(layout, pool, beyond, cohorts, T) < target


def test_inputs_are_uniform_integers_between_half_and_all_of_l():
    cohorts = draw_cohorts(20_000, 4, seed=1, output_range=(512, 1024))
    for tokens in (1001, 4096):
        inputs = cohorts.inputs(tokens)
        assert inputs.min() == tokens // 2 and inputs.max() == tokens
        counts = np.bincount(inputs.ravel() - tokens // 2)
        assert len(counts) == tokens - tokens // 2 + 1
        assert abs(inputs.mean() - (tokens // 2 + tokens) / 2) < 0.01 * tokens
    outputs = cohorts.outputs
    assert outputs.min() == 512 and outputs.max() == 1024
    assert np.all(np.diff(np.stack([cohorts.inputs(t) for t in range(1000, 1100)]), axis=0) >= 0)


def test_pools_from_the_dcu_budget():
    # 52.8 GiB for weights + KV, 24 GiB of full weights, 64 KiB per token (appendix B)
    sharded = pool_from_budget(Layout.DOP, 52.8 * GIB, 24 * GIB, 65536, 8)
    replicated = pool_from_budget(Layout.DP, 52.8 * GIB, 24 * GIB, 65536, 8)
    assert sharded == pool_from_budget(Layout.TP, 52.8 * GIB, 24 * GIB, 65536, 8) == int((52.8 - 3) * GIB // 65536)
    assert replicated == pool_from_budget(Layout.CP, 52.8 * GIB, 24 * GIB, 65536, 8) == int(28.8 * GIB // 65536)


def test_nothing_fits_gives_zero():
    cohorts = draw_cohorts(100, 4, seed=0, output_range=(512, 1024))
    assert residency_limit(Layout.TP, 100, cohorts, 2) == 0
