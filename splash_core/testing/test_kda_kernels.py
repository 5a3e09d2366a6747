"""The backend's KDA kernels match the torch reference recurrence (:mod:`splash_core.reference.kda`)."""

from __future__ import annotations

import pytest
import torch

from splash_core.reference import kda as ref

from .kda_inputs import kda_inputs


def _relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.fixture(scope="module")
def kda(conformance_backend, conformance_device, conformance_dtype):
    return conformance_backend.kda_kernels(conformance_device, conformance_dtype)


@pytest.mark.parametrize("entry,tokens", [("chunk", 70), ("step", 1)])
def test_kda_matches_reference(kda, conformance_device, conformance_dtype, entry, tokens):
    args = kda_inputs(2, tokens, 2, 64, conformance_device, conformance_dtype)
    out, state = getattr(kda, entry)(*args)
    ref_out, ref_state = ref.recurrent(*args)
    limit = 2e-2 if conformance_dtype != torch.float32 else 5e-3
    assert out.shape == ref_out.shape and out.dtype == args[2].dtype
    assert state.shape == ref_state.shape and state.dtype == torch.float32
    assert _relative_error(out, ref_out) < limit, f"{kda.name} {entry}: output differs"
    assert _relative_error(state, ref_state) < limit, f"{kda.name} {entry}: final state differs"
