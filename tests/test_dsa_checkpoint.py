"""A DeepseekV32ForCausalLM folder written by transformers loads, and SPLASH's single-device
reference model (runtime/reference_model.py, sparse attention through splash_core.model.dsa)
computes transformers' float32 logits at every position of a 21-token prompt and 32 greedy
tokens, with index_topk = 6 so that most queries attend over a strict subset of their keys.

The check can fail: dense attention (the reference model's and the runtime's default) and
the indexer's top-k raised past the sequence give logits off by far more than the tolerance;
NaN logits and an empty comparison are refused. A V3.2 config relabelled DeepseekV3ForCausalLM
is refused naming an index_* key.

Top-k is discontinuous, and exact ties decide it by the sort's internals: with 2 indexer heads of
random-sign weights many keys score exactly 0 (every ReLU zero) and transformers itself then
selects differently for different sequence lengths (its cached and full forwards disagree). So
the model here has 8 indexer heads with positive weights, where exact ties are rare, as in the
real model (64 heads).
"""

from __future__ import annotations

import dataclasses
import json

import hf_checkpoints as hf
import pytest
import torch
from transformers import AutoModelForCausalLM  # hf_checkpoints skips this module without transformers
from transformers.models.deepseek_v32 import DeepseekV32Config

from splash_core.checkpoint.source import CheckpointWeights
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.profiles.checkpoint_family import CheckpointError
from splash_core.runtime.reference_model import ReferenceModel

PROMPT, NEW, TOPK = [3, 17, 5, 99, 23, 8, 41, 2, 77, 120, 15, 64, 33, 9, 101, 44, 58, 7, 150, 6, 12], 32, 6
TOLERANCE = 1e-4  # max |SPLASH - transformers| / max |transformers logit|, float32
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}


def write_v32(folder, prompts) -> list:
    """A tiny DeepseekV32ForCausalLM written into ``folder`` by transformers; returns its greedy
    (tokens, float32 logits) for each prompt."""
    cfg = DeepseekV32Config(**{**hf.BASE, "n_group": 4, "topk_group": 2, "n_shared_experts": 1},
                            rope_parameters=YARN, index_n_heads=8, index_head_dim=16, index_topk=TOPK)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    hf._redraw(model, seed=37)
    with torch.no_grad():  # positive head weights: an index score is 0 only where all 8 heads' ReLUs are
        for layer in model.model.layers:
            layer.self_attn.indexer.weights_proj.weight.abs_()
    model.save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return [hf.greedy(model, list(p), NEW) for p in prompts]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(folder, transformers' greedy tokens, its float32 logits of every predicting position)."""
    folder = tmp_path_factory.mktemp("v32")
    (tokens, logits), = write_v32(folder, [PROMPT])
    return str(folder), tokens, logits


@torch.no_grad()
def splash_logits(profile, folder: str, tokens: list[int], sparse: bool = True) -> torch.Tensor:
    """The reference model's logits [len(PROMPT) + NEW - 1, V]: the prompt as one prefill, then one
    decode step per greedy token (teacher forcing)."""
    ref = ReferenceModel(profile, CheckpointWeights(folder, profile), sparse=sparse)
    seq = torch.tensor(PROMPT + tokens)
    rows = [ref.logits(ref.forward(0, 0, seq[: len(PROMPT)]))]
    rows += [ref.logits(ref.forward(0, p, seq[p: p + 1])) for p in range(len(PROMPT), len(seq) - 1)]
    return torch.cat(rows)


def error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Relative logit error; fails on NaN/inf, empty input and a shape mismatch."""
    assert ours.numel() > 0 and ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert torch.isfinite(ours).all() and torch.isfinite(theirs).all()
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def test_profile_from_config(checkpoint):
    profile = profile_from_checkpoint(checkpoint[0])
    idx = profile.indexer
    assert (idx.heads, idx.head_dim, idx.topk, idx.dtype, idx.scale_bytes) == (8, 16, TOPK, "fp32", 0)
    assert profile.rope_interleave and profile.moe.first_k_dense_replace == 1


def test_reference_model_gives_transformers_logits_and_tokens(checkpoint):
    folder, tokens, theirs = checkpoint
    profile = profile_from_checkpoint(folder)
    ours = splash_logits(profile, folder, tokens)
    assert error(ours, theirs) < TOLERANCE
    assert ours[len(PROMPT) - 1:].argmax(-1).tolist() == tokens


def test_dense_attention_would_differ(checkpoint):
    """Sparsity matters here: dense attention (the reference model's default) and a top-k past the
    sequence (dense too) are caught; sparse needs an indexer."""
    folder, tokens, theirs = checkpoint
    profile = profile_from_checkpoint(folder)
    assert error(splash_logits(profile, folder, tokens, sparse=False), theirs) > 100 * TOLERANCE
    dense = dataclasses.replace(profile, indexer=dataclasses.replace(profile.indexer, topk=len(PROMPT) + NEW))
    assert error(splash_logits(dense, folder, tokens), theirs) > 100 * TOLERANCE
    with pytest.raises(ValueError, match="needs a DSA indexer"):
        ReferenceModel(dataclasses.replace(profile, indexer=None), CheckpointWeights(folder, profile), sparse=True)
    bad = theirs.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(AssertionError):
        error(bad, theirs)
    with pytest.raises(AssertionError):
        error(theirs[:0], theirs[:0])


def test_relabelled_v32_is_refused(checkpoint, tmp_path):
    folder = checkpoint[0]
    cfg = json.loads((tmp_path.parent / folder / "config.json").read_text())
    cfg["architectures"] = ["DeepseekV3ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="index_"):
        profile_from_checkpoint(tmp_path)
