"""The expanded form on torch's fused SDPA kernels on a real GPU, in bf16 at DeepSeek's per-head widths
(keys 128 + 64, values 128), against the float32 reference: the conformance case (requests out of
order, a CP-style one through the Triton fallback, rows that see nothing) and chunks after history
(the merged history + causal parts, equal requests batched), also in shape buckets. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from test_sdpa_expanded_provider import Spy
from torch.nn.attention import SDPBackend

from splash_core.reference.expanded import expanded_attention
from splash_core.testing.mla_inputs import expanded_case
from splash_core.testing.test_mla_kernels import _assert_matches

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("heads", [16, 128])
def test_sdpa_provider_meets_the_contract_in_bf16(backend, heads):
    from splash_core.kernels import triton_expanded_attention
    from splash_core.kernels.expanded_sdpa import sdpa_expanded_attention

    case = expanded_case(torch.device("cuda"), torch.bfloat16, heads=heads)
    got = sdpa_expanded_attention(backend, triton_expanded_attention())(*case)
    _assert_matches(got, expanded_attention(*case), torch.bfloat16, f"{backend.name} expanded")


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_chunks_after_history_batched_and_merged_in_bf16(backend):
    from bench_scripts import load_bench

    from splash_core.kernels.expanded_sdpa import sdpa_expanded_attention

    bench = load_bench("expanded_attention")
    spy = Spy()
    for batch, rows, history in ((1, 300, 0), (3, 256, 700)):
        case = bench.chunk_case(torch.device("cuda"), bench.FULL, batch, rows, history, 128)
        got = sdpa_expanded_attention(backend, spy)(*case)
        _assert_matches(got, expanded_attention(*case), torch.bfloat16, f"{backend.name} B={batch} history={history}")
    assert spy.rows == []


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_bucketed_calls_meet_the_contract_in_bf16(backend):
    """Shape buckets (history pieces, the remainder in front of the padded causal chunk, padded
    queries, batches of 2^k) on the fused kernels: the conformance case and chunks after history."""
    from bench_scripts import load_bench

    from splash_core.kernels import triton_expanded_attention
    from splash_core.kernels.expanded_buckets import BucketSizes
    from splash_core.kernels.expanded_sdpa import sdpa_expanded_attention

    provider = sdpa_expanded_attention(backend, triton_expanded_attention(), buckets=BucketSizes(256, 64, 128))
    case = expanded_case(torch.device("cuda"), torch.bfloat16, heads=128)
    _assert_matches(provider(*case), expanded_attention(*case), torch.bfloat16, f"{backend.name} buckets")
    bench = load_bench("expanded_attention")
    for batch, rows, history in ((1, 300, 0), (3, 256, 700), (2, 1000, 1300)):
        case = bench.chunk_case(torch.device("cuda"), bench.FULL, batch, rows, history, 128)
        _assert_matches(provider(*case), expanded_attention(*case), torch.bfloat16,
                        f"{backend.name} buckets B={batch} history={history}")
