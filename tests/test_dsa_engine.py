"""DeepSeek Sparse Attention through the engine: `splash generate --model DIR` on a tiny
DeepseekV32ForCausalLM folder written by transformers (index_topk 6, a 21-token prompt, so most
queries attend over a strict subset of their keys) attends sparsely at T = 2, switching TP -> CP
and DP -> DOP live: its greedy tokens are transformers' and the reference check (sparse too) passes
exactly.

The check can fail: the same engine run with dense attention forced (``sparse_attention: false``)
gives other tokens, and the reference check of the model's real (sparse) function refuses them.
"""

from __future__ import annotations

import json

import hf_checkpoints as hf
import numpy as np
import pytest
from test_dsa_checkpoint import PROMPT, TOPK, write_v32

from splash_core.checkpoint.tiny import write_tokenizer
from splash_core.cli.main import main
from splash_core.engine import Job, serve
from splash_core.engine.reference_check import check
from splash_core.engine.requests import GenerationRequest
from splash_core.profiles import load

NEW = 8


@pytest.fixture(scope="module")
def v32(tmp_path_factory):
    """(folder, transformers' first NEW greedy tokens after PROMPT)."""
    folder = tmp_path_factory.mktemp("v32-engine")
    (tokens, _), = write_v32(folder, [PROMPT])
    write_tokenizer(folder, hf.BASE["vocab_size"])
    return str(folder), tokens[:NEW]


@pytest.mark.parametrize("policy", ["script:TP,CP:4", "script:DP,DOP:4"])
def test_generate_attends_sparsely_and_matches_transformers(v32, capsys, policy):
    folder, want = v32
    assert len(PROMPT) > TOPK
    assert main(["generate", "--model", folder, "--T", "2", "--policy", policy, "--prompt-ids",
                 ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW), "--ignore-eos", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == want
    assert set(out["layout_steps"]) == set(policy.split(":")[1].split(",")) and out["switch_count"] >= 1
    assert out["check"]["passed"] and out["check"]["exact"] and out["check"]["tokens"] == NEW


def _deployment(folder: str, sparse: bool) -> dict:
    return {"kind": "deployment", "name": "v32-tiny", "backend": "reference", "hardware": "cpu", "T": 2,
            "model": {"path": folder, "kv_cache": {"latent_dtype": "fp32", "rope_dtype": "fp32"}},
            "memory_fraction": 0.5, "reserve_gib": 0.0, "page_size": 4, "compute_dtype": "fp32",
            "sparse_attention": sparse}


def test_dense_attention_gives_other_tokens_and_fails_the_check(rank_pools, v32):
    folder, want = v32
    job = Job(_deployment(folder, False), policy="TP", prompts=(GenerationRequest(tuple(PROMPT), NEW),))
    dense = rank_pools(2).run(serve, job)[0].outputs[0]["token_ids"]
    assert dense != want
    real = load("deployment", _deployment(folder, True))
    result = check(real, {0: np.array(PROMPT)}, {0: dense})
    assert not result.passed and result.mismatches > 0
