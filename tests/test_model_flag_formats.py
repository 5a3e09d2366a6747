"""``--model DIR`` keeps the stored formats the deployment's model asks for (issue 38): a deployment
with DeepSeek-V3.2's scaled FP8 KV cache serves a checkpoint folder with that cache (not the
compute format, as before), its indexer keys likewise where both models have an indexer of that
width, and the run passes the tolerance-aware reference check."""

from __future__ import annotations

import dataclasses

import pytest

from splash_core.checkpoint.deployments import resolve
from splash_core.profiles import load
from splash_core.profiles.model import IndexerConfig

SCALED = dict(latent_dtype="fp8", rope_dtype="bf16", scale_bytes=16)


def test_a_checkpoint_keeps_the_deployments_kv_format_and_the_compute_one_stays_where_asked():
    fp8 = load("deployment", "cpu-tiny-fp8kv")
    folder = fp8.model.checkpoint
    assert dataclasses.asdict(resolve("cpu-tiny-fp8kv", model=folder).model.kv_cache) == SCALED
    plain = resolve("cpu-tiny", model=folder).model.kv_cache
    assert (plain.latent_dtype, plain.scale_bytes) == (load("deployment", "cpu-tiny").model.kv_cache.latent_dtype, 0)


def test_indexer_keys_keep_the_deployments_format_where_the_widths_agree(tmp_path):
    hf = pytest.importorskip("hf_checkpoints")
    hf.write_dsa("glm5-shared", tmp_path)
    base = load("deployment", "cpu-tiny")
    found = resolve(base, model=str(tmp_path)).model.indexer
    assert found.dtype != "fp8" and found.scale_bytes == 0
    wanted = IndexerConfig(heads=found.heads, head_dim=found.head_dim, topk=found.topk, dtype="fp8", scale_bytes=4)
    asking = dataclasses.replace(base, model=dataclasses.replace(base.model, indexer=wanted))
    got = resolve(asking, model=str(tmp_path)).model.indexer
    assert (got.dtype, got.scale_bytes, got.topk) == ("fp8", 4, found.topk)
    other = dataclasses.replace(wanted, head_dim=found.head_dim * 2)  # another model's indexer: the folder's stays
    kept = resolve(dataclasses.replace(base, model=dataclasses.replace(base.model, indexer=other)), model=str(tmp_path))
    assert kept.model.indexer.dtype == found.dtype


def test_a_checkpoint_served_with_the_scaled_fp8_cache_passes_the_reference_check(rank_pools):
    from splash_core.engine import Job, serve
    from splash_core.engine.requests import GenerationRequest

    deployment = load("deployment", "cpu-tiny-fp8kv")
    job = Job("cpu-tiny-fp8kv", model=deployment.model.checkpoint, policy="script:TP,CP:3",
              prompts=(GenerationRequest([3, 17, 5, 99, 23, 8, 41, 2, 77, 120], 8),))
    summary = rank_pools(2).run(serve, job)[0]
    assert summary.check["passed"] and summary.served == 1, summary.check["line"]
