"""Attention projections (Q-B, KV-B, O) kept FP8 as an FP8 block-scaled checkpoint stores them (issue 38).

The tiny FP8 checkpoint of tests/test_fp8_ffn_weights.py (32 x 32 blocks) splits Q-B's 96 rows
into head shards of 48 (T = 2) or 24 (T = 4) rows and O's 64 columns into 16 (T = 4): shards that
start inside a block, whose neighbours share the boundary block. Kept FP8, a rank holds the bytes
it read (plus KV-B's compute-format copy for the absorbed products); shards cut from all heads are
what a rank reads for its heads, and joined back are all heads, bit for bit, while a wrong scale on
a shared block is refused; W8A8 kernels stay within the tolerance-aware check (which a NaN fails);
the model's logits are the dequantize-at-load model's, bit for bit, in every layout at T = 1, 2, 4.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from test_fp8_ffn_weights import (assert_same_generation, both_ways,  # noqa: F401  (the FP8 checkpoint fixture)
                                  corrupted, folders)

from splash_core.checkpoint.deployments import check_checkpoint
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.layouts import Layout
from splash_core.model.fp8_blocks import StackedFP8, gemm_mismatch
from splash_core.model.mla import MLAMath, MLAWeights
from splash_core.model.rotary import Rotary
from splash_core.model.weights import SeededWeights, head_shard
from splash_core.planning.weight_bytes import weight_report
from splash_core.profiles import loader
from splash_core.profiles.checkpoint_config import CheckpointError, profile_from_checkpoint
from splash_core.profiles.model import LayerKind
from splash_core.profiles.projections import projections
from splash_core.reference.fp8_linear import KERNELS as REFERENCE_FP8

PAGE = 16
KERNEL_TOL = 0.1  # W8A8 against the dequantized weights, of the largest |value| (as the FFN kernel path)


class _Counted:
    """A source counting the bytes of the FP8 slices it hands out as stored."""

    def __init__(self, source):
        self.source, self.kept_bytes = source, 0

    def get(self, *args, **kwargs):
        return self.source.get(*args, **kwargs)

    def get_block_scaled(self, *args, **kwargs):
        part = self.source.get_block_scaled(*args, **kwargs)
        self.kept_bytes += part.stored_bytes
        return part


def _load(folder, profile, layer=0, heads=None, fp8=True, source=None):
    return MLAWeights.load(source or CheckpointWeights(folder, profile), profile, layer, heads, fp8=fp8)


def _same(a: StackedFP8, b: StackedFP8) -> bool:
    pa, pb = a.parts[0], b.parts[0]
    return (pa.start == pb.start and torch.equal(pa.scales, pb.scales)
            and torch.equal(pa.codes.view(torch.uint8), pb.codes.view(torch.uint8)))


@pytest.mark.parametrize("T", [1, 2, 4])
def test_a_rank_holds_the_fp8_bytes_it_read(folders, T):  # noqa: F811
    profile = profile_from_checkpoint(folders[1])
    for rank in range(T):
        for layer in range(profile.num_layers):
            heads = head_shard(profile.mla.heads, rank, T)
            source = _Counted(CheckpointWeights(folders[1], profile))
            w = _load(folders[1], profile, layer, heads, source=source)
            assert all(isinstance(getattr(w, n), StackedFP8) for n in MLAWeights.SHARDED)
            stored = sum(getattr(w, n).stored_bytes for n in MLAWeights.SHARDED)
            assert stored == source.kept_bytes > 0
            dense = _load(folders[1], profile, layer, heads, fp8=False)
            assert torch.equal(w.kv_b_dense, dense.kv_b)  # KV-B's compute copy: the dequantize-at-load one
            assert w.nbytes()["projections"] == stored + dense.kv_b.numel() * 4  # float32 compute here
            for n in ("q_b", "o"):  # a quarter of float32, plus the touched blocks' scales
                assert getattr(w, n).stored_bytes < 0.3 * getattr(dense, n).numel() * 4


@pytest.mark.parametrize("T", [2, 4])
def test_shards_cut_and_joined_are_what_ranks_read_and_all_heads(folders, T):  # noqa: F811
    profile = profile_from_checkpoint(folders[1])
    whole = _load(folders[1], profile)
    shards = [whole.shard(r, T) for r in range(T)]
    starts = set()
    for r, shard in enumerate(shards):
        read = _load(folders[1], profile, heads=head_shard(profile.mla.heads, r, T))
        for n in MLAWeights.SHARDED:
            assert _same(getattr(shard, n), getattr(read, n)), (T, r, n)
            starts.add(getattr(shard, n).parts[0].start)
        assert torch.equal(shard.kv_b_dense, read.kv_b_dense)
    assert any(s != (0, 0) for s in starts)  # some shard starts inside a block: the case joining must handle
    joined = MLAWeights.from_shards(shards)
    assert all(_same(getattr(joined, n), getattr(whole, n)) for n in MLAWeights.SHARDED)
    assert torch.equal(joined.kv_b_dense, whole.kv_b_dense)


def test_a_wrong_scale_on_a_shared_block_is_refused(folders):  # noqa: F811
    """Rank 1's Q-B shard (rows 48..95 in 32-row blocks) shares block 1 with rank 0's: a gather
    delivering it with another scale must not be joined silently."""
    profile = profile_from_checkpoint(folders[1])
    shards = [_load(folders[1], profile).shard(r, 2) for r in range(2)]
    assert shards[1].q_b.parts[0].start == (16, 0)
    shards[1].q_b.parts[0].scales[0, 0] *= 2.0
    with pytest.raises(ValueError, match="disagree on the scale of the block they share"):
        MLAWeights.from_shards(shards)


def test_fp8_kernels_stay_within_the_tolerance_and_the_check_can_fail(folders):  # noqa: F811
    profile = profile_from_checkpoint(folders[1])
    w = _load(folders[1], profile)
    exact, kernels = MLAMath(profile), MLAMath(profile, fp8_kernels=REFERENCE_FP8)
    gen = torch.Generator().manual_seed(0)
    q_in = torch.randn(5, profile.mla.q_lora_rank, generator=gen)
    latent = torch.randn(5, profile.mla.heads, profile.mla.kv_lora_rank, generator=gen)
    rot = Rotary.at(torch.arange(5), profile.mla.qk_rope_head_dim, profile.rope_theta, profile.rope_scaling)
    for f, x in ((lambda m, x: m.queries(w, x, rot), q_in), (lambda m, x: m.output(w, x), latent)):  # Q-B, O
        got, want = f(kernels, x), f(exact, x)
        assert gemm_mismatch(got, want, KERNEL_TOL) == "" and not torch.equal(got, want)
        bad = x.clone()
        bad[1, 0] = float("nan")
        assert "not finite" in gemm_mismatch(f(kernels, bad), want, KERNEL_TOL)


def test_a_source_without_fp8_weights_and_an_unknown_format_are_refused(folders):  # noqa: F811
    profile = profile_from_checkpoint(folders[1])
    with pytest.raises(ValueError, match="attention weights kept FP8 need an FP8 block-scaled source"):
        MLAWeights.load(_NoFP8(), profile, 0, fp8=True)
    base = {"kind": "deployment", "name": "attn", "backend": "reference", "hardware": "cpu", "T": 1,
            "model": "tiny-mla", "memory_fraction": 0.5, "reserve_gib": 0.0}
    with pytest.raises(Exception, match="attention_weights"):
        loader.load("deployment", {**base, "attention_weights": "fp4"})
    assert loader.load("deployment", base).attention_weights == "compute"


class _NoFP8:
    def get(self, *args, **kwargs):
        return SeededWeights(0).get(*args, **kwargs)


@pytest.mark.parametrize("T", [1, 2, 4])
def test_kept_fp8_attention_gives_the_dequantized_models_logits_in_every_layout(rank_pools, folders, T):  # noqa: F811
    got = rank_pools(T).run(both_ways, folders[1], "fp8_attention")[0]
    for layout in Layout:
        assert_same_generation(got[str(layout), False], got[str(layout), True], layout)


def _o_scales(model):
    return model.layers[0].weights.o.parts[0].scales  # layer 0's O


def test_a_corrupted_scale_changes_the_logits(rank_pools, folders):  # noqa: F811
    """The equality above can fail: the kept scales are what the model computes with."""
    before, after = rank_pools(1).run(corrupted, folders[1], "fp8_attention", _o_scales)[0]
    assert not torch.equal(torch.as_tensor(before), torch.as_tensor(after))


def test_a_checkpoint_not_storing_attention_fp8_is_refused_before_any_rank_starts(folders):  # noqa: F811
    def deployment(folder):
        return loader.load("deployment", {
            "kind": "deployment", "name": "attn", "backend": "reference", "hardware": "cpu", "T": 2,
            "model": {"path": folder, "kv_cache": {"latent_dtype": "fp32", "rope_dtype": "fp32"}},
            "memory_fraction": 0.5, "reserve_gib": 0.0, "page_size": PAGE, "compute_dtype": "fp32",
            "attention_weights": "fp8"})

    with pytest.raises(CheckpointError, match="self_attn.q_b_proj.weight: not stored FP8 block-scaled") as info:
        check_checkpoint(deployment(folders[0]))
    assert "\n" not in str(info.value)
    check_checkpoint(deployment(folders[1]))


def test_eq9_counts_the_scale_blocks_of_fp8_projections():
    """DeepSeek-V3 at T = 8: every head shard is whole 128 x 128 blocks, so the group receives
    (1 - 1/T) of the stored bytes, scales included; the tiny checkpoint's shards at T = 4 share
    boundary blocks, each sending the most any shard touches."""
    v3 = loader.load("model", "deepseek-v3")
    bare, scaled = weight_report(v3, 8, "fp8"), weight_report(v3, 8, "fp8", scale_block=(128, 128))
    [mla], [plain] = scaled.kinds, bare.kinds
    blocks = (1536 // 128) * (128 * 192 // 128) + (512 // 128) * (128 * 256 // 128) + (128 * 128 // 128) * (7168 // 128)
    assert mla.layer_bytes == plain.layer_bytes + 4 * blocks
    assert mla.received_per_rank == mla.layer_bytes - mla.layer_bytes // 8 == 7 * mla.shard_bytes
    o = projections(v3, LayerKind.MLA, "fp8", (32, 32))[2]
    assert o.shard_bytes(4) == 16384 * 7168 // 4 + 4 * (7168 // 32) * (4096 // 32)  # O: 4096 of its columns
    tiny = dataclasses.replace(v3, mla=dataclasses.replace(v3.mla, heads=4, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                                            q_lora_rank=48))
    q_b = projections(tiny, LayerKind.MLA, "fp8", (32, 32))[0]  # rows 24 a shard: from 0, 24, 48, 72
    assert q_b.shard_bytes(4) == 48 * 96 // 4 + 4 * 2 * 2  # two row blocks (from 24: rows 24..47) x two col blocks


def test_the_engine_plans_fp8_attention_with_the_checkpoints_scale_blocks(folders):  # noqa: F811
    """A checkpoint's weight_block_size reaches its profile, Eq 9 then counts the scales by default for
    fp8, and a job keeping attention FP8 plans switches with those bytes (what the runtime moves)."""
    from splash_core.engine.engine import Job, deployment_of
    from splash_core.engine.requests import GenerationRequest
    from splash_core.profiles.schema import ProfileError

    profile = profile_from_checkpoint(folders[1])
    assert profile.weight_scale_block == (32, 32) and profile_from_checkpoint(folders[0]).weight_scale_block is None
    assert weight_report(profile, 2, "fp8").kinds[0].layer_bytes == \
        weight_report(profile, 2, "fp8", scale_block=(32, 32)).kinds[0].layer_bytes  # the default follows the profile
    planned = {}
    for held in ("fp8", "compute"):
        path = Path(folders[1]).parent / f"dep-{held}.yaml"
        path.write_text(f"kind: deployment\nname: fp8-attention\nbackend: reference\nhardware: cpu\nT: 2\n"
                        f"model: {{path: {folders[1]}}}\ncompute_dtype: fp32\nattention_weights: {held}\n")
        planned[held] = deployment_of(Job(str(path), prompts=(GenerationRequest((1, 2, 3), 2),))).model
    assert planned["fp8"].weight_dtype == "fp8" and planned["fp8"].weight_scale_block == (32, 32)
    assert planned["compute"] == profile  # held in the compute format: planned as the profile says
    assert weight_report(planned["fp8"], 2).kinds[0].received_per_rank == \
        weight_report(profile, 2, "fp8", scale_block=(32, 32)).kinds[0].received_per_rank
    tiny = dict(loader.read_yaml(loader.find("model", "tiny-mla")))
    with pytest.raises(ProfileError, match="weight_scale_block"):
        loader.load("model", {**tiny, "weight_scale_block": [0, 128]})
