"""Attention projections kept FP8 multiplied by a backend's FP8 kernels (the Triton W8A8 GEMMs of
``splash_fp8_linear_kernels``, in Triton's interpreter) on the tiny FP8 checkpoint of
tests/test_fp8_ffn_weights.py: every rank's Q-B queries and O output of its head shard (shards
starting inside a 32 x 32 block at T = 2 and 4) within the tolerance-aware check of the
dequantized weights' (activations rounded to e4m3 per token group), not bit-equal (the kernels ran),
and a wrong scale block fails the check.
"""

from __future__ import annotations

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch
from test_fp8_ffn_weights import folders  # noqa: F401  (the FP8 checkpoint fixture)

from splash_core.checkpoint.source import CheckpointWeights
from splash_core.kernels.fp8_block_gemm import triton_fp8_linear_kernels
from splash_core.model.fp8_blocks import gemm_mismatch
from splash_core.model.mla import MLAMath, MLAWeights
from splash_core.model.rotary import Rotary
from splash_core.model.weights import head_shard
from splash_core.profiles.checkpoint_config import profile_from_checkpoint

TOL = 0.1  # of the largest |value|, as the FFN kernel path


def _outputs(folder, T, kernels, fault=None):
    """(kernel path, dequantized path) of every rank's queries and O output, layer 0."""
    profile = profile_from_checkpoint(folder)
    m = profile.mla
    gen = torch.Generator().manual_seed(T)
    q_in, latent = torch.randn(6, m.q_lora_rank, generator=gen), torch.randn(6, m.heads, m.kv_lora_rank, generator=gen)
    rot = Rotary.at(torch.arange(6), m.qk_rope_head_dim, profile.rope_theta, profile.rope_scaling)
    fast, exact = MLAMath(profile, fp8_kernels=kernels), MLAMath(profile)
    out = []
    for rank in range(T):
        heads = head_shard(m.heads, rank, T)
        w = MLAWeights.load(CheckpointWeights(folder, profile), profile, 0, heads, fp8=True)
        if fault is not None:
            fault(w)
        mine = latent[:, heads.start: heads.stop]
        out.append((fast.queries(w, q_in, rot), exact.queries(w, q_in, rot)))
        out.append((fast.output(w, mine), exact.output(w, mine)))
    return out


@pytest.mark.parametrize("T", [1, 2, 4])
def test_every_ranks_projections_are_within_the_w8a8_tolerance(folders, T):  # noqa: F811
    for got, want in _outputs(folders[1], T, triton_fp8_linear_kernels()):
        assert gemm_mismatch(got, want, TOL) == "" and not torch.equal(got, want)


def test_a_wrong_scale_block_fails_the_check(folders):  # noqa: F811
    kernels = triton_fp8_linear_kernels()
    exact = _outputs(folders[1], 2, kernels)

    def wrong_scale(w):
        w.o.parts[0].scales[0, 0] *= 4.0

    faulty = _outputs(folders[1], 2, kernels, wrong_scale)
    outputs = [(got, want) for (got, _), (_, want) in zip(faulty, exact)][1::2]  # the O outputs
    assert all("above" in gemm_mismatch(got, want, TOL) for got, want in outputs)
