"""What ``splash run`` checks before any rank starts, so a job that cannot run fails at once with
one line instead of after the ranks have spawned and allocated their pools: the runtime must be
able to store the model's KV cache format, and every request of the workload must fit, alone,
in a layout the policy may run (else admission would reject it at run time and the run would
serve less than it was asked to)."""

from __future__ import annotations

import numpy as np

from ..model.kv_format import kv_format_problem
from .admission import Admission, KVCapacity, plan_capacity
from .requests import Request


class JobError(ValueError):
    """A job that cannot run as given: names the profile or option and why."""


def check_job(deployment, workload, policy, kv_pages: int | None = None) -> KVCapacity:
    """The KV capacity the job will run with; JobError if it cannot run (``policy`` is a policy
    object, :func:`~splash_core.engine.policy.make_policy`)."""
    problem = kv_format_problem(deployment.model)
    if problem:
        raise JobError(f"deployment {deployment.name!r}: model.kv_cache: {problem}")
    specs = workload.requests()
    try:
        capacity = plan_capacity(deployment, workload.concurrency,
                                 [s.prompt_tokens + s.max_new_tokens for s in specs], kv_pages)
    except ValueError as exc:
        raise JobError(str(exc)) from None
    admission = Admission(capacity, workload.concurrency, policy.layouts)
    refused = [(spec, admission.refusal(Request(spec, np.zeros(0, np.int64)))) for spec in specs]
    refused = [(spec, reason) for spec, reason in refused if reason]
    if refused:
        spec, reason = refused[0]
        others = f" ({len(refused) - 1} more like it)" if len(refused) > 1 else ""
        fix = "raise --kv-pages" if kv_pages is not None else "give the deployment more memory"
        raise JobError(f"workload {workload.name!r}: request {spec.id} can never run{others}: {reason} "
                       f"under policy {policy.name}; {fix} or shorten the requests")
    return capacity
