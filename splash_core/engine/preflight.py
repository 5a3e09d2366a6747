"""What ``splash run`` and ``splash generate`` check before any rank starts, so a job that cannot
run fails at once with one line instead of after the ranks have spawned and allocated their
pools: the runtime must be able to store the model's KV cache format, every layout the policy may
run must hold the weights the ranks would load (counted from the checkpoint's headers or
config.json, :mod:`splash_core.engine.memory_plan`), the graph pool, the reserve and the KV pool
the run plans, every request must fit,
alone, in a layout the policy may run (else admission would reject it at run time and the run
would serve less than it was asked to), and a prompt given to ``generate`` must fit the
checkpoint's context length."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..model.kv_format import kv_format_problem
from ..profiles.checkpoint_config import read_config
from ..profiles.workload import RequestSpec
from .admission import Admission, KVCapacity, plan_capacity
from .memory_plan import deployment_memory, refusal
from .requests import Request


class JobError(ValueError):
    """A job that cannot run as given: names the profile or option and why."""


def check_job(deployment, workload, policy, kv_pages: int | None = None) -> KVCapacity:
    """The KV capacity the job will run with; JobError if it cannot run (``policy`` is a policy
    object, :func:`~splash_core.engine.policy.make_policy`)."""
    problem = kv_format_problem(deployment.model)
    if problem:
        raise JobError(f"deployment {deployment.name!r}: model.kv_cache: {problem}")
    return check_requests(deployment, workload.requests(), workload.concurrency, policy, kv_pages,
                          f"workload {workload.name!r}")


def check_requests(deployment, specs: Sequence[RequestSpec], concurrency: int, policy, kv_pages: int | None,
                   what: str) -> KVCapacity:
    """The KV capacity a run of ``specs`` gets (as :func:`~splash_core.engine.admission.plan_capacity`
    sizes it: nothing is allocated here); JobError naming the first request that no layout the
    policy may run could hold, by the rule admission applies at run time and ``splash serve`` to
    every request (:meth:`~splash_core.engine.admission.Admission.refusal`); JobError too where a
    layout of the policy cannot hold the weights its ranks would load beside the graph pool, the
    reserve and one KV page, or the pool planned here (:func:`~splash_core.engine.memory_plan.refusal`).
    ``what``: the requests' source in words, for the message."""
    if not specs:
        raise JobError(f"{what}: no requests to run")
    memory = deployment_memory(deployment, tuple(policy.layouts))
    problem = refusal(memory)  # the weights first: no pool is worth planning if they do not fit
    if problem:
        raise JobError(problem)
    try:
        capacity = plan_capacity(deployment, concurrency, [s.prompt_tokens + s.max_new_tokens for s in specs], kv_pages,
                                 policy.layouts, memory)
    except ValueError as exc:
        raise JobError(str(exc)) from None
    admission = Admission(capacity, concurrency, policy.layouts)
    refused = [(spec, admission.refusal(Request(spec, np.zeros(0, np.int64)))) for spec in specs]
    refused = [(spec, reason) for spec, reason in refused if reason]
    if refused:
        spec, reason = refused[0]
        others = f" ({len(refused) - 1} more like it)" if len(refused) > 1 else ""
        fix = "raise --kv-pages" if kv_pages is not None else "give the deployment more memory"
        raise JobError(f"{what}: request {spec.id} can never run{others}: {reason} "
                       f"under policy {policy.name}; {fix} or shorten the requests")
    problem = refusal(memory, capacity.pages * int(deployment.kv_page_bytes))
    if problem:
        fix = "lower --kv-pages" if kv_pages is not None else "lower the deployment's reserve_gib"
        raise JobError(f"{problem}; {fix}")
    return capacity


def check_context(folder: str | None, prompt_tokens: int, max_new_tokens: int) -> None:
    """JobError if prompt + output exceed the checkpoint's context length (``max_position_embeddings``
    in its config.json; a model without a checkpoint folder states none), as ``splash serve`` refuses."""
    limit = read_config(folder)[1].get("max_position_embeddings") if folder else None
    if isinstance(limit, int) and prompt_tokens + max_new_tokens > limit:
        raise JobError(f"{prompt_tokens} prompt + {max_new_tokens} output tokens exceed this model's context "
                       f"length of {limit} tokens (max_position_embeddings in its config.json)")
