"""Start the group for a job: under torchrun (the environment names the rank) join it, else
spawn T ranks on this host with :class:`~splash_core.runtime.spawn.RankPool`.

Collectives time out after the deployment's ``collective_timeout_s`` (or ``timeout_s``), so a
rank that crashes or hangs stops the group with an error naming a rank instead of a hang. A
torchrun world of another size than the deployment's T is refused on every process before any
joins (:class:`~splash_core.engine.preflight.JobError`; the command line has rank 0 say so).
"""

from __future__ import annotations

import os

from ..runtime.group import from_env, shutdown
from ..runtime.spawn import RankPool
from .engine import Job, deployment_of, serve
from .preflight import JobError
from .summary import RunSummary


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_rank() -> int | None:
    """This process's rank in the group torchrun started (None: not started by torchrun)."""
    return int(os.environ["RANK"]) if under_torchrun() else None


def check_world(T: int, name: str) -> None:
    """Under torchrun, refuse a world that is not ``T`` processes (one per rank of deployment ``name``)."""
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) != T:
        raise JobError(f"torchrun started {os.environ['WORLD_SIZE']} processes, but deployment {name!r} has "
                       f"T = {T}: start one process per rank (--nnodes x --nproc-per-node = {T})")


def run_job(job: Job, *, timeout_s: float | None = None, run_timeout_s: float = 24 * 3600.0) -> RunSummary | None:
    """Serve ``job`` on a fresh group; the summary on rank 0 (and in a spawning parent), else None."""
    deployment = deployment_of(job)
    timeout = timeout_s or deployment.collective_timeout_s
    check_world(deployment.T, deployment.name)
    if under_torchrun():
        ctx = from_env(deployment.backend, timeout)
        try:
            return serve(ctx, job)
        finally:
            shutdown(ctx)
    with RankPool(deployment.T, backend=deployment.backend, timeout_s=timeout) as pool:
        return pool.run(serve, job, timeout_s=run_timeout_s)[0]
