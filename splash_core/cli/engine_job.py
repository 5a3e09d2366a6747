"""What ``splash run`` and ``splash generate`` share: the deployment a command line names (with
``--model``), the check that its backend can run here, and starting the group."""

from __future__ import annotations

import sys

from ..platform.backend import get_backend
from .args import UsageError


def deployment_for(args):
    """The deployment of ``--deployment`` with ``--model`` (and ``--T``, ``--layout`` where the
    command has them) applied, its checkpoint checked against its config.json."""
    from ..checkpoint.deployments import check_checkpoint, resolve
    from ..layouts import Layout

    layout = getattr(args, "layout", None)
    if layout is not None:
        try:
            Layout.parse(layout)
        except ValueError as exc:  # an unknown --layout; other errors name their own cause
            raise UsageError(f"--layout: {exc}") from None
    deployment = resolve(args.deployment, model=args.model, T=getattr(args, "T", None), layout=layout)
    check_checkpoint(deployment)
    backend = get_backend(deployment.backend)
    if not backend.info.accelerator and deployment.hardware.platform != "cpu":
        raise UsageError(f"deployment {deployment.name!r} is for {deployment.hardware.platform}, but backend "
                         f"{deployment.backend!r} resolved to {backend.name!r} on the CPU here; run it on that "
                         f"machine with its backend installed (splash backends), or use a CPU deployment")
    return deployment


def check_torchrun_world(deployment) -> bool:
    """Under torchrun, whether this process may go on: a world of the wrong size is refused in one
    line by rank 0 (UsageError) and left quietly by the others (False), before any rank joins."""
    from ..engine.launch import check_world, torchrun_rank
    from ..engine.preflight import JobError

    try:
        check_world(deployment.T, deployment.name)
    except JobError as exc:
        if torchrun_rank():
            return False  # see run_group: rank 0 says why, once
        raise UsageError(str(exc)) from None
    return True


def run_group(job, command: str, timeout_s: float | None):
    """Serve ``job`` on its group: the summary (None on ranks other than 0 under torchrun), the
    exit code 1 when a rank failed (its error printed), or 0, quietly, on ranks other than 0 of a
    torchrun group the job refused (rank 0 raises the one-line error)."""
    from ..engine import run_job
    from ..engine.launch import torchrun_rank
    from ..engine.preflight import JobError
    from ..runtime.spawn import RankError

    try:
        return run_job(job, timeout_s=timeout_s)
    except JobError as exc:  # refused on every process before any joined the group
        if torchrun_rank():
            # rank 0 says why and fails the job, once; ending first with a failure of their own, the
            # others would have torchrun stop rank 0 before it could say it
            return 0
        raise UsageError(str(exc)) from None
    except RankError as exc:
        print(str(exc), file=sys.stderr)
        print(f"splash {command}: error: the group stopped: rank {exc.rank} failed (its error is above)", file=sys.stderr)
        return 1
