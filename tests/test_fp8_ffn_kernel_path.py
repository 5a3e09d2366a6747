"""Feed-forward weights kept FP8, multiplied by a backend's FP8 kernels (the Triton W8A8 GEMMs of
``splash_fp8_linear_kernels``) instead of dequantized, in Triton's interpreter on the tiny FP8
checkpoint of tests/test_fp8_ffn_weights.py (32 x 32 blocks: TP shards start inside a block).

Activations are rounded to e4m3 per token group (relative error up to 2**-4 each), twice per
FFN (before gate/up and before down), so the kernel path is checked by the tolerance-aware check,
not for equality: every rank's FFN part within FFN_TOL of the dequantized one (measured at most
0.051 of the largest |value| on these shapes, T = 1, 2, 5), a NaN or a wrong scale block fails it;
the whole model's logits, teacher-forced with the dequantized model's tokens, within LOGIT_TOL
(measured 0.037),
its greedy token the same wherever the reference's top-2 margin exceeds twice the error, and not
bit-equal (so the kernels did run).
"""

from __future__ import annotations

import dataclasses

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch
from test_fp8_ffn_weights import folders  # noqa: F401  (the FP8 checkpoint fixture)

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.kernels.fp8_block_gemm import triton_fp8_linear_kernels
from splash_core.layouts import Layout
from splash_core.model.fp8_blocks import gemm_mismatch
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.runtime.feed_forward import load_feed_forward
from splash_core.runtime.model import Model
from splash_core.runtime.model_config import ModelConfig, RankOps

FFN_TOL = 0.1
LOGIT_TOL = 0.1
PAGE, CHUNK, NEW = 16, 8, 6
PROMPT = (88, 4, 131, 27, 60, 19, 2, 140, 70)


class _Partial:
    """Collectives whose all-reduce is the identity: one rank's part as is."""

    def all_reduce(self, t):
        return t


def _parts(folder, T, x, kernels, fault=None, layers=None):
    """Every rank's FFN part of every layer (or of ``layers``): (kernel path, dequantized path)."""
    profile = profile_from_checkpoint(folder)
    out = []
    for rank in range(T):
        for layer in layers or range(profile.num_layers):
            ffn, ref = (load_feed_forward(CheckpointWeights(folder, profile), profile, layer, rank, T, fp8=True,
                                          fp8_kernels=k) for k in (kernels, None))
            if fault is not None:
                fault(ffn)
            out.append((ffn.forward(x, _Partial()), ref.forward(x, _Partial())))
    return out


# At T > 1 a small step builds every routed pair and drops other ranks' (experts.expert_outputs): their
# rows of the gate/up output are never written, and quantizing that unset memory before the down
# projection may divide inf by inf, which numpy warns about in the interpreter; those rows are dropped.
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("T", [1, 2])
def test_every_ranks_ffn_part_is_within_the_w8a8_tolerance(folders, T):  # noqa: F811
    profile = profile_from_checkpoint(folders[1])
    x = torch.randn(9, profile.hidden_size, generator=torch.Generator().manual_seed(T))
    for got, want in _parts(folders[1], T, x, triton_fp8_linear_kernels()):
        assert gemm_mismatch(got, want, FFN_TOL) == ""


# the planted NaN passes through a max in Triton's interpreter, which numpy warns about: expected here
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
def test_the_tolerance_check_fails_on_nan_and_on_a_wrong_scale(folders):  # noqa: F811
    profile = profile_from_checkpoint(folders[1])
    x = torch.randn(9, profile.hidden_size, generator=torch.Generator().manual_seed(0))
    kernels = triton_fp8_linear_kernels()
    nan = x.clone()
    nan[3, 5] = float("nan")
    [(got, want)] = _parts(folders[1], 1, nan, kernels, layers=[0])
    assert "not finite" in gemm_mismatch(got, want, FFN_TOL)

    def wrong_scale(ffn):
        ffn.down.parts[0].scales[0, 0] *= 4.0  # the dense MLP's first down block

    [(got, want)] = _parts(folders[1], 1, x, kernels, wrong_scale, layers=[0])
    assert "above" in gemm_mismatch(got, want, FFN_TOL)


def _model_logits(ctx, folder, forced):
    """Logits of every step of the FP8-kept model, with the backend's ops plus the Triton FP8 kernels
    (``forced``: the tokens fed; None: greedy, dequantized at each use), and the tokens."""
    profile = profile_from_checkpoint(folder)
    config = ModelConfig(profile, Layout.TP, pages_per_layer=16, page_size=PAGE, dtype=torch.float32, fp8_ffn=True)
    ops = RankOps.of(ctx, config)
    if forced is not None:
        ops = dataclasses.replace(ops, fp8_kernels=triton_fp8_linear_kernels())
    model = Model(config, ops, CheckpointWeights(folder, profile))
    gen = generate(model.step, [Prompt(0, 0, PROMPT)], T=1, page_size=PAGE, chunk=CHUNK, new_tokens=NEW,
                   release=model.release, forced=None if forced is None else {0: forced})
    return [torch.as_tensor(logits)[0] for _, logits in gen.steps], gen.tokens[0]


def test_the_model_with_fp8_kernels_follows_the_dequantized_model(rank_pools, folders):  # noqa: F811
    pool = rank_pools(1)
    want, tokens = pool.run(_model_logits, folders[1], None)[0]
    got, _ = pool.run(_model_logits, folders[1], list(tokens))[0]
    assert len(got) == len(want) > 0 and len(tokens) == NEW
    scale = max(float(w.abs().max()) for w in want)
    errors = [gemm_mismatch(g, w, LOGIT_TOL) for g, w in zip(got, want)]
    assert errors == [""] * len(want)
    diffs = [float((g - w).abs().max()) for g, w in zip(got, want)]
    assert max(diffs) > 0  # the kernels ran: the dequantized path is bit-equal to dequantize-at-load
    for g, w, err in zip(got, want, diffs):
        top2 = torch.topk(w, 2).values
        if float(top2[0] - top2[1]) > 2 * err:
            assert int(g.argmax()) == int(w.argmax())
    print(f"\nFP8 kernels vs dequantized weights: largest logit error {max(diffs) / scale:.3g} of the largest |logit|")


def test_the_triton_kernels_pass_the_conformance_checks():
    """What ``splash_core.testing`` asks of a backend's FP8 GEMMs, run on the portable ones here."""
    from splash_core.testing import test_fp8_linear_kernels as conformance

    kernels, cpu = triton_fp8_linear_kernels(), torch.device("cpu")
    conformance.test_linear_matches_the_spec_on_a_slice_starting_mid_block(kernels, cpu, torch.float32)
    conformance.test_grouped_matches_the_spec_per_expert(kernels, cpu, torch.float32)
