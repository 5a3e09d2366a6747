"""DeepSeek-V3.2's FP8 indexer keys (e4m3 codes with a float32 scale, as the deployment's model asks)
on a tiny V3.2 checkpoint written by transformers (issue 37 §2): served through live switches, the
run passes the tolerance-aware reference check (the reference rounds its indexer keys as the pool
stores them); and the top-k the FP8 keys select agrees with the full-precision keys' on most rows'
keys (measured here and reported), so the format really changes what is selected a little."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from test_dsa_checkpoint import write_v32

from splash_core.checkpoint.source import CheckpointWeights
from splash_core.paths import project_path
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.runtime import reference_model
from splash_core.runtime.reference_model import ReferenceModel

PROMPT = [3, 17, 5, 99, 23, 8, 41, 2, 77, 120, 15, 64, 33, 9, 101, 44, 58, 7, 150, 6, 12]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("v32-fp8-keys")
    write_v32(path, [PROMPT])
    return str(path)


def _fp8_keys(folder: str) -> dict:
    found = profile_from_checkpoint(folder).indexer
    return {"heads": found.heads, "head_dim": found.head_dim, "topk": found.topk, "dtype": "fp8", "scale_bytes": 4}


def _selections(profile, folder: str) -> list[torch.Tensor]:
    """Every full layer's selection mask, token by token over PROMPT (the reference, teacher-forced)."""
    chosen, original = [], ReferenceModel._selected

    def recording(self, *args):
        mask = original(self, *args)
        chosen.append(mask.clone())
        return mask

    ReferenceModel._selected = recording
    try:
        ref = ReferenceModel(profile, CheckpointWeights(folder, profile), sparse=True)
        _feed(ref, PROMPT)
    finally:
        ReferenceModel._selected = original
    return chosen


def _feed(ref: ReferenceModel, prompt: list[int]) -> None:
    from splash_core.runtime.step_batch import StepBatch, StepRequest

    for pos, token in enumerate(prompt):
        ref.step(StepBatch.build([StepRequest(0, 0, pos, 1)], 1, 16), torch.tensor([token]))


def test_fp8_index_keys_change_few_selections(folder):
    plain = profile_from_checkpoint(folder)
    fp8 = profile_from_checkpoint(folder, {"indexer": _fp8_keys(folder)})
    full, rounded = _selections(plain, folder), _selections(fp8, folder)
    assert len(full) == len(rounded) > 0
    picked = sum(int(m.sum()) for m in full)
    same = sum(int((a & b).sum()) for a, b in zip(full, rounded))
    agreement = same / picked
    print(f"top-k agreement of FP8 indexer keys with full precision: {agreement:.4f} ({same}/{picked} keys)")
    assert 0.9 < agreement < 1.0  # most keys agree; some differ: the scaled format really rounds what selects
    assert reference_model.indexer_layout(fp8) is not None  # the keys really went through the scaled format


def test_fp8_index_keys_pass_the_reference_check_through_switches(rank_pools, folder):
    from splash_core.engine import Job, serve
    from splash_core.engine.requests import GenerationRequest

    deployment = yaml.safe_load((project_path("profiles") / "deployments" / "cpu-tiny.yaml").read_text())
    deployment.update(name="cpu-v32-fp8-keys", sparse_attention=None,
                      model={"path": folder, "indexer": _fp8_keys(folder)})
    job = Job(deployment, policy="script:TP,CP,DOP:4", prompts=(GenerationRequest(PROMPT, 12),))
    summary = rank_pools(2).run(serve, job)[0]
    assert summary.check["passed"] and summary.served == 1, summary.check["line"]
    assert len(summary.switches) == 2
    from splash_core.engine import reference_check
    from splash_core.profiles.loader import load

    out = summary.outputs[0]
    wrong = list(out["token_ids"])
    wrong[5] = (wrong[5] + 1) % 100  # planted: one wrong token fails the same check
    bad = reference_check.check(load("deployment", deployment), {0: np.asarray(out["prompt_token_ids"])}, {0: wrong})
    assert not bad.passed and "output 5" in bad.first_failure, bad.line()
