"""GLM-5 (``GlmMoeDsaForCausalLM``) against transformers itself, on a tiny checkpoint transformers
writes: 4 layers whose indexers are full, shared, full, shared (a shared layer has no indexer
and reuses the previous full layer's top-k), the indexer's RoPE interleaved (V3.2's rotates
halves), a dense first layer then sigmoid group-limited MoE, v_head_dim != qk_nope_head_dim, YaRN,
index_topk 6 against a 21-token prompt so that selection drops keys from the first step on.

The proof is test_checkpoint_transformers' (two prompts, chunked prefill, teacher forcing with
transformers' 32 greedy tokens): SPLASH's single-device reference and its runtime in every layout
at T = 1, 2, 4, attending sparsely, give transformers' logits (within 1e-4 of the largest |logit|,
float32) and greedy tokens, also where each shared layer computes in another layout than the
full layer before it (T = 2: its selection gathered from the owners or cut to the own rows), as a
layer-by-layer live switch may leave them; the engine generates the tokens while switching live
through all 12 directions (T = 2); `splash generate --model DIR` prints them.

The checks can fail: dense attention, the indexer rotating halves (V3.2's convention) and a
shared layer attending over every visible key instead of the full layer's selection move the
logits far past the tolerance; so does a shared layer in another layout given other rows'
selection (planted by hand: rolling the gathered selection by one row fails the mixed layouts at
an error of 0.96); NaN, an empty comparison and a missing position are refused. Configs SPLASH
cannot honour (a shared first layer, a pattern key disagreeing with ``indexer_types``, an
unknown key) are refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import hf_checkpoints as hf
import pytest
import test_checkpoint_transformers as base
import torch

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint import tiny
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.cli.main import main
from splash_core.layouts import Layout
from splash_core.profiles.checkpoint_config import CheckpointError, profile_from_checkpoint
from splash_core.runtime.model import Model
from splash_core.runtime.reference_model import ReferenceModel

TOLERANCE = 1e-4
TOPK = hf.VARIANTS["glm5-shared"]["index_topk"]


@pytest.fixture(scope="module")
def glm5(tmp_path_factory):
    """(folder, transformers' (tokens, float32 logits) per prompt); the folder holds the builtin
    tiny checkpoint's tokenizer (same vocabulary)."""
    root = tmp_path_factory.mktemp("glm5")
    folder = root / "hf"
    model = hf.write_dsa("glm5-shared", folder, seed=5)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny.ensure("tiny-deepseek-v3", root / "tiny")) / name, folder / name)
    return str(folder), [hf.greedy(model, p, base.NEW) for p in base.PROMPTS]


def error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Relative logit error; fails on NaN/inf, empty input and a shape mismatch."""
    assert ours.numel() > 0 and ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert torch.isfinite(ours).all() and torch.isfinite(theirs).all()
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


@torch.no_grad()
def reference_logits(profile, folder: str, prompt: list[int], tokens: list[int], sparse: bool = True):
    """The reference model's logits of every predicting position: the prompt as one prefill, then
    one decode step per greedy token (teacher forcing)."""
    ref = ReferenceModel(profile, CheckpointWeights(folder, profile), sparse=sparse)
    seq = torch.tensor(prompt + tokens)
    rows = [ref.logits(ref.forward(0, 0, seq[: len(prompt)]))]
    rows += [ref.logits(ref.forward(0, p, seq[p: p + 1])) for p in range(len(prompt), len(seq) - 1)]
    return torch.cat(rows)


def test_the_profile_is_derived_from_config_json(glm5):
    profile = profile_from_checkpoint(glm5[0])
    idx = profile.indexer
    assert (idx.heads, idx.head_dim, idx.topk, idx.shared_layers, idx.rope_interleave) == (8, 16, TOPK, (1, 3), True)
    assert [idx.selects(i) for i in range(4)] == [True, False, True, False]
    assert profile.rope_interleave and profile.mla.v_head_dim == 24 and profile.moe.first_k_dense_replace == 1
    assert (profile.moe.topk_method, profile.moe.scoring_func) == ("noaux_tc", "sigmoid")


def test_reference_model_gives_transformers_logits_and_can_fail(glm5):
    folder, ref = glm5
    profile = profile_from_checkpoint(folder)
    prompt, (tokens, theirs) = base.PROMPTS[0], ref[0]
    assert len(prompt) > TOPK
    ours = reference_logits(profile, folder, prompt, tokens)
    assert error(ours, theirs) < TOLERANCE and ours[len(prompt) - 1:].argmax(-1).tolist() == tokens
    halves = dataclasses.replace(profile, indexer=dataclasses.replace(profile.indexer, rope_interleave=False))
    assert error(reference_logits(profile, folder, prompt, tokens, sparse=False), theirs) > 100 * TOLERANCE
    assert error(reference_logits(halves, folder, prompt, tokens), theirs) > 100 * TOLERANCE
    bad = theirs.clone()
    bad[0, 0] = float("nan")
    for ours_, theirs_ in ((bad, theirs), (theirs[:0], theirs[:0]), (theirs[1:], theirs)):
        with pytest.raises(AssertionError):
            error(ours_, theirs_)


# each shared layer in another layout than the full layer before it, as in the middle of a live switch:
# its selection is gathered from the owners (DP/DOP -> TP/CP) or cut to the own rows (TP/CP -> DP/DOP)
MIXED = {"DP,TP,DOP,CP": (Layout.DP, Layout.TP, Layout.DOP, Layout.CP),
         "CP,DOP,TP,DP": (Layout.CP, Layout.DOP, Layout.TP, Layout.DP)}


def test_shared_layers_attend_over_the_full_layers_selection(glm5, monkeypatch):
    """The fault of a shared layer attending over every visible key instead of the keys the full
    layer before it selected is caught."""
    folder, ref = glm5
    profile = profile_from_checkpoint(folder)
    real = ReferenceModel._selected

    def shared_dense(self, layer, request, x, q_in, pos, visible):
        return visible if not self.profile.indexer.selects(layer) else real(self, layer, request, x, q_in, pos, visible)

    monkeypatch.setattr(ReferenceModel, "_selected", shared_dense)
    prompt, (tokens, theirs) = base.PROMPTS[0], ref[0]
    assert error(reference_logits(profile, folder, prompt, tokens), theirs) > 100 * TOLERANCE


def _layouts(ctx, folder: str, forced, cases):
    """On each rank: each case's layouts (one for all layers, or one per layer), attending sparsely,
    teacher-forced with transformers' tokens."""
    profile, out = profile_from_checkpoint(folder), {}
    owners = (0, ctx.world_size - 1)
    prompts = [Prompt(i, owners[i], tuple(p)) for i, p in enumerate(base.PROMPTS)]
    for name, layouts in cases.items():
        model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), layouts, pages_per_layer=16,
                                   page_size=base.PAGE, dtype=torch.float32, sparse_attention=True)
        out[name] = generate(model.step, prompts, T=ctx.world_size, page_size=base.PAGE, chunk=base.CHUNK,
                                    new_tokens=base.NEW, release=model.release, forced=dict(enumerate(forced)))
    return out if ctx.rank == 0 else None


@pytest.mark.parametrize("T", [1, 2, 4])
def test_every_layout_gives_transformers_logits_and_tokens(rank_pools, glm5, T):
    folder, ref = glm5
    cases = {str(layout): layout for layout in Layout} | (MIXED if T == 2 else {})
    got = rank_pools(T).run(_layouts, folder, [tokens for tokens, _ in ref], cases)[0]
    assert set(got) == set(cases)
    for layout in cases:
        base.assert_equals_transformers(got[layout], ref, TOLERANCE, layout)


def test_live_switches_in_every_direction_keep_transformers_tokens(rank_pools, glm5):
    folder, ref = glm5
    base.assert_switches_keep_tokens(rank_pools(2), folder, ref, 2)


def test_splash_generate_prints_transformers_tokens(glm5, capsys):
    folder, ref = glm5
    prompt, tokens = base.PROMPTS[0], ref[0][0][:8]
    assert main(["generate", "--model", folder, "--T", "2", "--policy", "script:TP,CP:4", "--prompt-ids",
                 ",".join(map(str, prompt)), "--max-new-tokens", "8", "--ignore-eos", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == tokens and out["switch_count"] >= 1
    assert out["check"]["passed"] and out["check"]["exact"] and out["check"]["tokens"] == 8


@pytest.mark.parametrize("spelling", [{"index_topk_pattern": "FSFS"}, {"index_topk_pattern": ["full", "shared"] * 2},
                                      {"index_topk_freq": 2, "index_skip_topk_offset": 1}])
def test_indexer_types_derived_as_transformers_derives_them(glm5, tmp_path, spelling):
    cfg = json.loads((Path(glm5[0]) / "config.json").read_text())
    del cfg["indexer_types"]
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **spelling}))
    assert profile_from_checkpoint(tmp_path).indexer.shared_layers == (1, 3)
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # no spelling at all: every layer full
    assert profile_from_checkpoint(tmp_path).indexer.shared_layers == ()


@pytest.mark.parametrize("change, key", [
    ({"indexer_types": ["shared", "full", "full", "shared"]}, "indexer_types[0]"),
    ({"index_topk_freq": 3, "index_skip_topk_offset": 1}, "index_topk_freq"),
    ({"indexer_types": ["full", "sparse", "full", "shared"]}, "indexer_types[1]"),
    ({"index_new_knob": 1}, "index_new_knob"),
])
def test_configs_it_cannot_honour_are_refused_by_name(glm5, tmp_path, change, key):
    cfg = json.loads((Path(glm5[0]) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(CheckpointError, match=key.replace("[", r"\[")):
        profile_from_checkpoint(tmp_path)
