"""Start the group for a job: under torchrun (the environment names the rank) join it, else
spawn T ranks on this host with :class:`~splash_core.runtime.spawn.RankPool`.

Collectives time out after the deployment's ``collective_timeout_s`` (or ``timeout_s``), so a
rank that crashes or hangs stops the group with an error naming a rank instead of a hang.
"""

from __future__ import annotations

import os

from ..runtime.group import from_env, shutdown
from ..runtime.spawn import RankPool
from .engine import Job, deployment_of, serve
from .summary import RunSummary


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_job(job: Job, *, timeout_s: float | None = None, run_timeout_s: float = 24 * 3600.0) -> RunSummary | None:
    """Serve ``job`` on a fresh group; the summary on rank 0 (and in a spawning parent), else None."""
    deployment = deployment_of(job)
    timeout = timeout_s or deployment.collective_timeout_s
    if under_torchrun():
        ctx = from_env(deployment.backend, timeout)
        try:
            return serve(ctx, job)
        finally:
            shutdown(ctx)
    with RankPool(deployment.T, backend=deployment.backend, timeout_s=timeout) as pool:
        return pool.run(serve, job, timeout_s=run_timeout_s)[0]
