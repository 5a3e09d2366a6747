"""The benchmarks' own correctness checks can fail: NaN logits, NaN kernel errors, no rows to
compare and missing steps make them fail instead of passing vacuously (Python's ``max`` drops a
NaN that is not first; ``allclose`` of empty selections is True; ``zip`` stops at the shorter)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from bench_scripts import load_bench

from splash_bench import step


def _run(*logits):
    """A teacher-forced run's record: one step per logits array, request 0 in each."""
    return types.SimpleNamespace(steps=[([0], np.asarray(a, dtype=np.float32)) for a in logits])


@pytest.mark.parametrize("compare", [step._compare, load_bench("kda_runtime")._compare], ids=["step", "kda_runtime"])
def test_equivalence_fails_on_nan_logits_and_on_nothing_compared(compare):
    ref = _run([[1.0, 3.0, 2.0]], [[0.5, 0.1, 2.0]])
    assert compare(_run([[1.0, 3.0, 2.0]], [[0.5, 0.1, 2.0]]), ref, 0.01)["passed"]
    nan_later = compare(_run([[1.0, 3.0, 2.0]], [[0.5, np.nan, 2.0]]), ref, 0.01)  # a NaN after a finite step
    assert not nan_later["passed"] and math.isnan(nan_later["max_abs_err"])
    assert not compare(_run(), _run(), 0.01)["passed"]  # zero steps compare nothing
    with pytest.raises(AssertionError, match="step count"):
        compare(_run([[1.0, 3.0, 2.0]]), ref, 0.01)  # a missing step is not skipped


def test_kernel_checks_fail_on_nan_and_on_rows_that_see_nothing():
    gpu = load_bench("gpu_kernels")
    out, lse = torch.ones(3, 2, 4), torch.zeros(3, 2)
    assert gpu._compare((out, lse), (out.clone(), lse.clone()), torch.float32)["ok"]
    nan = out.clone()
    nan[2, 1, 3] = float("nan")
    assert not gpu._compare((nan, lse), (out, lse), torch.float32)["ok"]
    empty_lse = torch.full((3, 2), float("-inf"))
    zeros = torch.zeros(3, 2, 4)
    assert not gpu._compare((zeros, empty_lse), (zeros, empty_lse), torch.float32)["ok"]  # nothing visible


def test_the_cost_model_checks_largest_error_keeps_a_nan():
    costmodel = load_bench("costmodel_check")
    assert costmodel._largest([1.0, 3.0]) == 3.0 and costmodel._largest([], default=0.0) == 0.0
    assert math.isnan(costmodel._largest([1.0, float("nan")]))  # max([1.0, nan]) is 1.0
    assert math.isnan(costmodel._errors({}, [{"error_pct": 2.0}, {"error_pct": float("nan")}])["max_abs_error_pct"])
