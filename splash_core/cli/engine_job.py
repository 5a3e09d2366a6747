"""What ``splash run`` and ``splash generate`` share: the deployment a command line names (with
``--model``), the check that its backend can run here, and starting the group."""

from __future__ import annotations

import sys

from ..platform.backend import get_backend
from ..profiles import ProfileError
from .args import UsageError


def deployment_for(args):
    """The deployment of ``--deployment`` with ``--model`` (and ``--T``, ``--layout`` where the
    command has them) applied, its checkpoint checked against its config.json."""
    from ..checkpoint.deployments import check_checkpoint, resolve

    try:
        deployment = resolve(args.deployment, model=args.model, T=getattr(args, "T", None),
                             layout=getattr(args, "layout", None))
    except ProfileError:
        raise
    except ValueError as exc:  # an unknown --layout
        raise UsageError(f"--layout: {exc}") from None
    check_checkpoint(deployment)
    backend = get_backend(deployment.backend)
    if not backend.info.accelerator and deployment.hardware.platform != "cpu":
        raise UsageError(f"deployment {deployment.name!r} is for {deployment.hardware.platform}, but backend "
                         f"{deployment.backend!r} resolved to {backend.name!r} on the CPU here; run it on that "
                         f"machine with its backend installed (splash backends), or use a CPU deployment")
    return deployment


def run_group(job, command: str, timeout_s: float | None):
    """Serve ``job`` on its group: the summary (None on ranks other than 0 under torchrun), or
    the exit code 1 when a rank failed (its error printed)."""
    from ..engine import run_job
    from ..runtime.spawn import RankError

    try:
        return run_job(job, timeout_s=timeout_s)
    except RankError as exc:
        print(str(exc), file=sys.stderr)
        print(f"splash {command}: error: the group stopped: rank {exc.rank} failed (its error is above)", file=sys.stderr)
        return 1
