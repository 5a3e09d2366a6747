"""The KDA reference against flash-linear-attention's own naive implementations (when fla
is installed; CI does not install it), and the fla adapter's behaviour without fla."""

from __future__ import annotations

import sys

import pytest
import torch

from splash_core.kernels import fla_kda_kernels, fla_missing_reason
from splash_core.reference import kda as ref
from splash_core.testing.kda_inputs import kda_inputs


def _naive():
    pytest.importorskip("einops")
    try:
        from fla.ops.kda import naive
    except Exception as exc:  # fla absent or unimportable here
        pytest.skip(f"fla-core not importable: {exc}")
    return naive


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
def test_reference_matches_fla_naive_recurrent_and_chunk():
    naive = _naive()
    q, k, v, g, beta, state, scale = kda_inputs(2, 32, 3, 16, torch.device("cpu"), torch.float32, seed=5)
    out, final = ref.recurrent(q, k, v, g, beta, state, scale)
    fla_out, fla_final = naive.naive_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=state,
                                                   output_final_state=True)
    torch.testing.assert_close(out, fla_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, fla_final, atol=1e-5, rtol=1e-5)
    chunk_out, chunk_final = naive.naive_chunk_kda(q, k, v, g, beta, scale=scale, initial_state=state,
                                                   output_final_state=True, chunk_size=16)
    torch.testing.assert_close(out, chunk_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, chunk_final, atol=1e-4, rtol=1e-4)


def test_without_fla_the_adapter_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # import fla -> ImportError
    monkeypatch.delitem(sys.modules, "fla.ops", raising=False)
    monkeypatch.delitem(sys.modules, "fla.ops.kda", raising=False)
    assert fla_kda_kernels() is None
    assert "fla-core" in fla_missing_reason()
