"""Shared fixtures. Multi-rank tests share one gloo pool per group size for the session
(spawning ranks costs seconds each)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("SPLASH_BACKENDS", "")  # tests see every installed plugin unless a test narrows it

# Triton decides interpreter or compiler when it defines a kernel, its own library's included, so on a
# host without an accelerator the interpreter goes on before any test module (transformers' models
# among them) imports Triton; tests/kernel_interpreter.py does the same for a kernel test run alone.
import torch  # noqa: E402

if not torch.cuda.is_available():
    import kernel_interpreter  # noqa: E402,F401


@pytest.fixture(scope="session")
def rank_pools():
    """``rank_pools(T)`` -> a live :class:`~splash_core.runtime.spawn.RankPool` of T gloo ranks.

    A pool that lost a rank (a test raised on some rank) is replaced on the next request."""
    from splash_core.runtime.spawn import RankPool

    pools: dict[int, RankPool] = {}

    def get(world_size: int) -> RankPool:
        pool = pools.get(world_size)
        if pool is None or not pool.alive:
            pool = pools[world_size] = RankPool(world_size, backend="reference", timeout_s=300)
        return pool

    yield get
    for pool in pools.values():
        pool.close()


@pytest.fixture
def no_ranks(monkeypatch):
    """Fail the test if a command would start ranks (spawning or joining a torchrun group)."""
    def refuse(*args, **kwargs):
        raise AssertionError("ranks started for a job that cannot run")

    monkeypatch.setattr("splash_core.engine.launch.RankPool", refuse)
    monkeypatch.setattr("splash_core.engine.launch.from_env", refuse)


@pytest.fixture(scope="session")
def glm5_folder(tmp_path_factory) -> str:
    """A tiny GLM-5 checkpoint (shared-indexer layers) written by transformers, for the switch tests."""
    import hf_checkpoints

    path = tmp_path_factory.mktemp("glm5-shared")
    hf_checkpoints.write_dsa("glm5-shared", path, seed=11)
    return str(path)
