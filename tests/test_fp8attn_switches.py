"""Live switches with the attention projections kept FP8 (``attention_weights: fp8``, issue 38):
through all 12 directions at T = 2 and 4 on CPU ranks, the tokens are the dequantize-at-load
deployment's and pass the exact reference check, and every sharded -> replicated switch receives
the FP8 codes and scale blocks that Eq 9 counts with scales (``weight_report(..., scale_block)``),
about a quarter of what the same switch moves with float32 attention weights; the memory plan
counts the attention projections a rank then holds as the runtime holds them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_fp8_ffn_weights import BLOCK, folders  # noqa: F401  (the FP8 checkpoint fixture, 32 x 32 blocks)

from splash_core.checkpoint.footprint import HEAD_INDEXED
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.engine import Job, serve
from splash_core.engine.memory_plan import deployment_memory
from splash_core.engine.policy import ScriptedPolicy
from splash_core.engine.requests import GenerationRequest
from splash_core.layouts import Layout, Placement
from splash_core.model.mla import MLAWeights
from splash_core.planning.weight_bytes import weight_report
from splash_core.profiles import loader
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.runtime.model import Model
from splash_core.runtime.step_batch import StepBatch
from splash_core.runtime.switch import SwitchExecutor

TP, DP, CP, DOP = Layout.TP, Layout.DP, Layout.CP, Layout.DOP
ALL_DIRECTIONS = (TP, DP, TP, CP, TP, DOP, DP, CP, DP, DOP, CP, DOP, TP)
PAGE, NEW = 16, 14
PROMPTS = ([3, 17, 5, 99, 23, 8, 41, 2, 77, 120, 15, 64, 33], [88, 4, 131, 27, 60, 19])


def _deployment(folder: str, T: int, attention: str) -> dict:
    return {"kind": "deployment", "name": "hf-tiny-fp8-attn", "backend": "reference", "hardware": "cpu", "T": T,
            "model": {"path": folder, "kv_cache": {"latent_dtype": "fp32", "rope_dtype": "fp32"}},
            "memory_fraction": 0.5, "reserve_gib": 0.0, "page_size": PAGE, "compute_dtype": "fp32",
            "attention_weights": attention}


def _gathers(summary) -> list[int]:
    """Weight bytes the group received in each sharded -> replicated switch."""
    return [s.bytes.get("weights", 0) for s in summary.switches if not s.refused
            and Layout(s.src).placement is Placement.SHARDED and Layout(s.dst).placement is Placement.REPLICATED]


@pytest.mark.parametrize("T", [2, 4])
def test_switches_in_every_direction_move_fp8_and_keep_the_tokens(rank_pools, folders, T):  # noqa: F811
    prompts = tuple(GenerationRequest(tuple(p), NEW) for p in PROMPTS)
    runs = {kept: rank_pools(T).run(serve, Job(_deployment(folders[1], T, kept),
                                               policy=ScriptedPolicy(ALL_DIRECTIONS, every=1), prompts=prompts))[0]
            for kept in ("compute", "fp8")}
    kept = runs["fp8"]
    assert len({(s.src, s.dst) for s in kept.switches if not s.refused}) == 12
    assert [o["token_ids"] for o in kept.outputs] == [o["token_ids"] for o in runs["compute"].outputs]
    assert all(len(o["token_ids"]) == NEW for o in kept.outputs)
    assert kept.check["passed"] and kept.check["exact"] and kept.check["tokens"] == len(PROMPTS) * NEW
    profile = profile_from_checkpoint(folders[1])
    eq9 = weight_report(profile, T, "fp8").received_by_group  # the checkpoint's blocks, from its profile
    assert eq9 == weight_report(profile, T, "fp8", scale_block=BLOCK).received_by_group
    unscaled = dataclasses.replace(profile, weight_scale_block=None)
    assert eq9 > weight_report(unscaled, T, "fp8").received_by_group  # the scales are counted
    assert _gathers(kept) and set(_gathers(kept)) == {eq9}
    assert set(_gathers(runs["compute"])) == {weight_report(profile, T, "fp32").received_by_group}
    for attention, run in runs.items():  # rank 0 starts in TP; the plan's busiest TP rank is rank 0 (ties)
        plan = deployment_memory(loader.load("deployment", _deployment(folders[1], T, attention)))
        assert plan.of(TP).parts[HEAD_INDEXED] == run.load["memory"]["weights"] > 0, attention


@pytest.mark.parametrize("sparse", [False, True])
def test_a_seeded_model_keeps_attention_fp8_through_switches(rank_pools, sparse):
    """Without a checkpoint the weights are drawn FP8 as such a checkpoint would hold them (held: Q-B and
    O as e4m3 codes, KV-B too plus its float32 copy; tiny-mla's 6-head shards of Q-B start inside a
    128-row block); dense, decode steps run from static buffers (what graphs replay), captured again
    after each switch lands new weights; sparse, through DeepSeek Sparse Attention's indexer."""
    deployment = {"kind": "deployment", "name": "seeded-fp8-attn", "backend": "reference", "hardware": "cpu",
                  "T": 2, "model": "tiny-mla", "memory_fraction": 0.5, "reserve_gib": 0.0, "page_size": PAGE,
                  "compute_dtype": "fp32", "sparse_attention": sparse, "graphs": {"mode": "static"}}
    prompts = tuple(GenerationRequest(tuple(p), 6) for p in PROMPTS)
    runs = {kept: rank_pools(2).run(serve, Job({**deployment, "attention_weights": kept},
                                               policy=ScriptedPolicy((TP, CP, DOP, DP, TP), every=1),
                                               prompts=prompts))[0] for kept in ("compute", "fp8")}
    kept = runs["fp8"]
    assert len([s for s in kept.switches if not s.refused]) == 4
    assert kept.check["passed"] and kept.check["exact"] and kept.check["tokens"] == len(PROMPTS) * 6
    assert 0 < kept.load["memory"]["weights"] < 0.75 * runs["compute"].load["memory"]["weights"]
    assert sparse or kept.load["graphs"]["while_serving"]["captures"] > 0


def _gathered(ctx, folder, fault: bool):
    """Layer 0's Q-B, KV-B and O after a TP -> DP switch on CPU ranks (rank 1's boundary scale of
    Q-B doubled first when ``fault``), with all heads as read whole; or the switch's error."""
    profile = profile_from_checkpoint(folder)
    model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), TP, pages_per_layer=4,
                               page_size=PAGE, dtype=torch.float32, fp8_attention=True)
    if fault and ctx.rank == 1:
        model.layers[0].weights.q_b.parts[0].scales[0, 0] *= 2.0  # the block rank 0's shard ends in
    try:
        report = SwitchExecutor(model, ctx).switch(StepBatch.build([(0, 0, 0, 1)], ctx.world_size, PAGE), DP)
    except ValueError as exc:
        return str(exc)
    whole = MLAWeights.load(CheckpointWeights(folder, profile), profile, 0, fp8=True)
    got = model.layers[0].weights
    same = [n for n in MLAWeights.SHARDED if _equal(getattr(got, n).parts[0], getattr(whole, n).parts[0])]
    return same, report.summary(), torch.equal(got.kv_b_dense, whole.kv_b_dense)


def _equal(a, b) -> bool:
    return (a.start == b.start and torch.equal(a.scales, b.scales)
            and torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8)))


@pytest.mark.parametrize("T", [2, 4])
def test_a_gather_rebuilds_the_stored_weights_and_refuses_a_wrong_shared_scale(rank_pools, folders, T):  # noqa: F811
    for same, report, kv_b in rank_pools(T).run(_gathered, folders[1], False):
        assert same == list(MLAWeights.SHARDED) and kv_b
        assert report["bytes_group"]["weights"] == weight_report(profile_from_checkpoint(folders[1]), T, "fp8",
                                                                 scale_block=BLOCK).received_by_group
    errors = rank_pools(T).run(_gathered, folders[1], True)  # every rank joins every shard: all refuse
    assert all(isinstance(e, str) and "disagree on the scale of the block they share" in e for e in errors)
