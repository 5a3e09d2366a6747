"""Feed-forward weights kept FP8 as an FP8 block-scaled checkpoint stores them (issue 38).

A tiny DeepSeek-V3 checkpoint written by transformers is rewritten FP8 in 32 x 32 blocks (so the
MLP's TP shards of 48 rows start inside a block and the experts' 24-row blocks are partial). Kept
FP8 (``ModelConfig.fp8_ffn``), a rank holds exactly the FFN bytes it read, and the model's logits
and greedy tokens are the dequantize-at-load model's, bit for bit, in every layout at T = 1 and 2
and through live switches; a corrupted scale changes them (the equality can fail); a checkpoint
or source that is not FP8 (before any rank starts, for a deployment) is refused in one line.
"""

from __future__ import annotations

import json
import shutil

import hf_checkpoints as hf
import pytest
import torch

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.deployments import check_checkpoint
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.engine import Job, serve
from splash_core.engine.policy import ScriptedPolicy
from splash_core.engine.requests import GenerationRequest
from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights, moe_tensor_shapes
from splash_core.profiles import loader
from splash_core.profiles.checkpoint_config import CheckpointError, profile_from_checkpoint
from splash_core.runtime.feed_forward import load_feed_forward
from splash_core.runtime.model import Model

BLOCK = (32, 32)
PAGE, CHUNK, NEW = 16, 8, 32
PROMPTS = ([3, 17, 5, 99, 23, 8, 41, 2, 77, 120, 15, 64, 33, 9, 101, 44, 58, 7, 150, 6, 12], [88, 4, 131, 27, 60, 19])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(bf16 checkpoint folder, its FP8 block-scaled rewrite in 32 x 32 blocks)."""
    root = tmp_path_factory.mktemp("fp8-ffn")
    hf.write("v3-yarn-interleaved", root / "bf16", dtype=torch.bfloat16, seed=3)
    from safetensors.torch import load_file, save_file

    (root / "fp8").mkdir()
    written = {}
    for file in sorted((root / "bf16").glob("*.safetensors")):
        for name, t in load_file(file).items():
            if hf.quantized(name):
                written[name], written[name + "_scale_inv"] = hf.quantize_fp8(t, BLOCK)
            else:
                written[name] = t
    save_file(written, str(root / "fp8" / "model.safetensors"))
    cfg = json.loads((root / "bf16" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(BLOCK)}
    (root / "fp8" / "config.json").write_text(json.dumps(cfg))
    for extra in (root / "bf16").iterdir():
        if extra.name not in ("config.json",) and extra.suffix != ".safetensors":
            shutil.copy(extra, root / "fp8" / extra.name)
    return str(root / "bf16"), str(root / "fp8")


def assert_same_generation(want, got, layout) -> None:
    """Two ``both_ways`` results (steps, tokens, ...): the same tokens, every step's ids and finite
    logits bit-equal."""
    (want_steps, want_tokens), (steps, tokens) = want[:2], got[:2]
    assert tokens == want_tokens and all(len(tokens[i]) == NEW for i in range(len(PROMPTS))), layout
    assert len(steps) == len(want_steps) > 0
    for (ids, logits), (want_ids, want_logits) in zip(steps, want_steps):
        assert list(ids) == list(want_ids)
        assert torch.isfinite(torch.as_tensor(logits)).all()
        assert torch.equal(torch.as_tensor(logits), torch.as_tensor(want_logits)), (layout, ids)


def both_ways(ctx, folder, kept_flag: str = "fp8_ffn"):
    """On each rank, in every layout: the dequantize-at-load model's and the model keeping FP8 what
    ``kept_flag`` (a :meth:`Model.from_context` flag) names: steps (ids and logits), tokens, FFN bytes."""
    profile = profile_from_checkpoint(folder)
    prompts = [Prompt(i, (0, ctx.world_size - 1)[i], tuple(p)) for i, p in enumerate(PROMPTS)]
    out = {}
    for layout in Layout:
        for kept in (False, True):
            model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), layout, pages_per_layer=16,
                                       page_size=PAGE, dtype=torch.float32, **{kept_flag: kept})
            gen = generate(model.step, prompts, T=ctx.world_size, page_size=PAGE, chunk=CHUNK, new_tokens=NEW,
                           release=model.release)
            ffn = sum(sum(m.nbytes().values()) for m in model.mlps if m is not None)
            out[str(layout), kept] = (gen.steps, gen.tokens, ffn)
    return out if ctx.rank == 0 else None


@pytest.mark.parametrize("T", [1, 2])
def test_kept_fp8_gives_the_dequantized_models_logits_and_tokens_in_every_layout(rank_pools, folders, T):
    got = rank_pools(T).run(both_ways, folders[1])[0]
    for layout in Layout:
        assert_same_generation(got[str(layout), False], got[str(layout), True], layout)
        kept_bytes, dense_bytes = got[str(layout), True][2], got[str(layout), False][2]
        assert kept_bytes < 0.4 * dense_bytes  # float32 compute: FP8 codes are a quarter, plus the router


def corrupted(ctx, folder, kept_flag: str = "fp8_ffn", scales=lambda model: model.mlps[1].gate_up.parts[0].scales):
    """Logits of the first step before and after one block of the kept scales ``scales(model)`` doubles
    (default: layer 1's experts')."""
    profile = profile_from_checkpoint(folder)
    model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), Layout.TP, pages_per_layer=16,
                               page_size=PAGE, dtype=torch.float32, **{kept_flag: True})
    prompts = [Prompt(0, 0, tuple(PROMPTS[1]))]
    before = generate(model.step, prompts, T=1, page_size=PAGE, chunk=CHUNK, new_tokens=2, release=model.release)
    scales(model).view(-1)[0].mul_(2.0)
    after = generate(model.step, prompts, T=1, page_size=PAGE, chunk=CHUNK, new_tokens=2, release=model.release)
    return before.steps[0][1], after.steps[0][1]


def test_a_corrupted_scale_changes_the_logits(rank_pools, folders):
    """The equality above can fail: the kept scales are what the model computes with."""
    before, after = rank_pools(1).run(corrupted, folders[1])[0]
    assert not torch.equal(torch.as_tensor(before), torch.as_tensor(after))


@pytest.mark.parametrize("T", [1, 2])
def test_a_rank_holds_the_fp8_bytes_it_read(folders, T):
    profile = profile_from_checkpoint(folders[1])
    for rank in range(T):
        for layer in range(profile.num_layers):
            source = CheckpointWeights(folders[1], profile)
            ffn = load_feed_forward(source, profile, layer, rank, T, fp8=True)
            read, held = source.bytes_read, ffn.nbytes()
            if profile.runtime_moe_layer(layer):  # the router: read as stored (bf16), held in float32
                routers = CheckpointWeights(folders[1], profile)
                for name, shape in moe_tensor_shapes(profile, layer, range(0)).items():
                    if ".gate." in name:
                        routers.get(name, shape)
                router_held = ffn.router.numel() * 4 + ffn.bias.numel() * 4
                assert held["experts"] > 0 and routers.bytes_read > 0
                assert held["experts"] + held["mlp"] - router_held == read - routers.bytes_read
            else:
                assert held["mlp"] == read > 0
            dense = load_feed_forward(CheckpointWeights(folders[1], profile), profile, layer, rank, T,
                                      dtype=torch.bfloat16)
            assert sum(held.values()) < 0.75 * sum(dense.nbytes().values())  # about half of bf16, not 2x


class _Summed:
    """Collectives of one rank whose all-reduce is the identity: a rank's partial output as is."""

    def all_reduce(self, t):
        return t


@pytest.mark.parametrize("T", [3, 5, 16])
def test_every_ranks_kept_fp8_part_equals_its_dequantized_part(folders, T):
    """Uneven and empty shards (T = 16: ranks without experts or MLP rows) and shards starting
    inside a block (T = 5: MLP rows from 20, 40, ...) compute exactly what dequantize-at-load does."""
    profile = profile_from_checkpoint(folders[1])
    x = torch.randn(7, profile.hidden_size, generator=torch.Generator().manual_seed(T))
    for rank in range(T):
        for layer in range(profile.num_layers):
            kept, dense = (load_feed_forward(CheckpointWeights(folders[1], profile), profile, layer, rank, T, fp8=fp8)
                           for fp8 in (True, False))
            got, want = kept.forward(x, _Summed()), dense.forward(x, _Summed())
            assert got.shape == (7, profile.hidden_size) and torch.isfinite(got).all()
            assert torch.equal(got, want), (T, rank, layer)


def test_a_checkpoint_or_source_that_is_not_fp8_is_refused(folders):
    profile = profile_from_checkpoint(folders[0])
    with pytest.raises(CheckpointError, match="not stored FP8 block-scaled") as info:
        load_feed_forward(CheckpointWeights(folders[0], profile), profile, 0, 0, 1, fp8=True)
    assert "\n" not in str(info.value) and "model.layers.0.mlp.gate_proj.weight" in str(info.value)
    with pytest.raises(ValueError, match="need an FP8 block-scaled checkpoint; the weights come from SeededWeights"):
        load_feed_forward(SeededWeights(0), profile, 1, 0, 1, fp8=True)
    # before any rank starts: the deployment's checkpoint check names the first FFN weight that is not FP8
    with pytest.raises(CheckpointError, match="mlp.gate_proj.weight: not stored FP8 block-scaled"):
        check_checkpoint(loader.load("deployment", _deployment(folders[0], 1, "fp8")))
    check_checkpoint(loader.load("deployment", _deployment(folders[1], 1, "fp8")))


def test_a_deployment_keeping_fp8_without_a_checkpoint_draws_seeded_fp8_weights():
    base = {"kind": "deployment", "name": "no-ckpt", "backend": "reference", "hardware": "cpu", "T": 1,
            "model": "tiny-mla", "memory_fraction": 0.5, "reserve_gib": 0.0}
    # seeded weights are drawn FP8 as a checkpoint stores them (tests/test_seeded_fp8_weights.py)
    assert loader.load("deployment", {**base, "ffn_weights": "fp8"}).ffn_weights == "fp8"
    with pytest.raises(Exception, match="ffn_weights"):
        loader.load("deployment", {**base, "ffn_weights": "fp4"})
    assert loader.load("deployment", base).ffn_weights == "compute"


def _deployment(folder: str, T: int, ffn: str) -> dict:
    return {"kind": "deployment", "name": "hf-tiny-fp8", "backend": "reference", "hardware": "cpu", "T": T,
            "model": {"path": folder, "kv_cache": {"latent_dtype": "fp32", "rope_dtype": "fp32"}},
            "memory_fraction": 0.5, "reserve_gib": 0.0, "page_size": PAGE, "compute_dtype": "fp32", "ffn_weights": ffn}


def test_live_switches_keep_the_dequantized_models_tokens(rank_pools, folders):
    prompts = tuple(GenerationRequest(tuple(p), NEW) for p in PROMPTS)
    policy = ScriptedPolicy((Layout.TP, Layout.DP, Layout.CP, Layout.DOP, Layout.TP), every=3)
    runs = {ffn: rank_pools(2).run(serve, Job(_deployment(folders[1], 2, ffn), policy=policy, prompts=prompts))[0]
            for ffn in ("compute", "fp8")}
    kept = runs["fp8"]
    assert len([s for s in kept.switches if not s.refused]) >= 3
    assert [o["token_ids"] for o in kept.outputs] == [o["token_ids"] for o in runs["compute"].outputs]
    assert all(len(o["token_ids"]) == NEW for o in kept.outputs)
    assert kept.check["passed"] and kept.check["exact"] and kept.check["tokens"] == len(PROMPTS) * NEW
    held = {ffn: run.load["memory"] for ffn, run in runs.items()}  # the deployment's field reached the model
    assert 0 < held["fp8"]["experts"] < 0.3 * held["compute"]["experts"]
