"""Serving a job: a workload's requests (``splash run``) or prompts given by token ids
(``splash generate``) on every rank of the group, then what the run produced.

:func:`serve` builds the rank's model (:func:`~splash_core.engine.steps.build`), runs rank 0's
plans (:func:`~splash_core.engine.steps.run_steps`) until every request is done, and on rank 0
checks the outputs against the single-device reference and returns the
:class:`~splash_core.engine.summary.RunSummary`. It is a module-level function taking the rank's
context first, so it runs under torchrun and inside a
:class:`~splash_core.runtime.spawn.RankPool` worker alike.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import time
import warnings
from typing import Callable

import numpy as np

from ..checkpoint.deployments import resolve
from ..checkpoint.footprint import HEAD_INDEXED
from ..model.fp8_blocks import BLOCK
from ..profiles import load
from ..profiles.deployment import DeploymentProfile
from ..profiles.hardware import GIB
from ..profiles.workload import RequestSpec
from . import reference_check
from .admission import plan_capacity
from .controller import Controller
from .memory_plan import deployment_memory
from .policy import make_policy
from .progress import Progress
from .requests import GenerationRequest, Request, State
from .steps import EngineError, Hooks, build, run_steps
from .summary import RunSummary, SwitchSummary, latency, precopy_counts

__all__ = ["EngineError", "Job", "deployment_of", "serve"]


@dataclasses.dataclass(frozen=True)
class Job:
    """What to serve, how. Profiles are names, paths, mappings (loaded on every rank) or a loaded
    deployment; ``policy`` is a spec string (:func:`~splash_core.engine.policy.make_policy`) or a
    picklable policy object. The requests are a workload's or, for ``splash generate``, the
    ``prompts`` given (then ``workload`` is None). ``model`` (a checkpoint folder) and ``T``
    replace the deployment's (:func:`splash_core.checkpoint.deployments.resolve`, on every rank:
    a loaded profile does not pickle)."""

    deployment: str | dict | DeploymentProfile
    workload: str | dict | None = None
    policy: object = "splash"
    prefill_chunk: int = 8192  # prefill rows per owner rank per step (as `splash simulate`)
    kv_pages: int | None = None  # pages per layer and rank (None: from the budget and the workload)
    switch_mode: str = "splash"  # how switches move state: "splash" (layer-pipelined), "blocking", "precopy"
    # (every switch pre-copied over precopy_steps steps) or "auto" (the scheduler picks one step or a pre-copy)
    precopy_steps: int = 4  # steps a pre-copy spans before its handoff ("auto": at most)
    check: bool = True  # compare outputs with the single-device reference (rank 0, after the run)
    check_tolerance: float | None = None  # for compute formats below float32 (None: the default)
    progress: bool = False  # progress bar on rank 0's stderr
    prompts: tuple[GenerationRequest, ...] = ()  # requests by prompt ids (instead of a workload)
    model: str | None = None  # a checkpoint folder to serve instead of the deployment's model
    T: int | None = None  # a group size instead of the deployment's
    overlap: bool = True  # plan step k+1 while the device runs step k (False: the host waits for every step's tokens)

    def __post_init__(self):
        if (self.workload is None) == (not self.prompts):
            raise ValueError("a job serves either a workload or prompts")


def deployment_of(job: Job) -> DeploymentProfile:
    """The job's deployment with its replacements, and M0 of Eq 5/6 (``common_gib``: the state
    outside attention) counted from the tensors its ranks load (:func:`counted_common_gib`), so
    the scheduler and the switch executor plan with the memory the run really has; with
    ``attention_weights: fp8`` its model's projections are planned as FP8 with their scales."""
    deployment = resolve(job.deployment, model=job.model, T=job.T)
    if deployment.attention_weights == "fp8":  # Eq 5 and 9 plan the FP8 codes and scales a switch moves
        block = deployment.model.weight_scale_block or (BLOCK, BLOCK)  # a seeded model's: DeepSeek's blocks
        model = dataclasses.replace(deployment.model, weight_dtype="fp8", weight_scale_block=tuple(block))
        deployment = dataclasses.replace(deployment, model=model)
    return dataclasses.replace(deployment, common_gib=counted_common_gib(deployment))


def counted_common_gib(deployment: DeploymentProfile) -> float:
    """On the busiest rank of any layout: every weight a rank holds but the head-indexed attention
    projections (which Eq 5's manifest counts itself) plus the decode-graph pool, in GiB."""
    plan = deployment_memory(deployment)
    return max(m.weights - m.parts[HEAD_INDEXED] + m.graphs for m in plan.layouts) / GIB


def _requests(job: Job, deployment) -> tuple[str, int, list[Request]]:
    """(name of what is served, concurrency, the requests with their prompts)."""
    if job.workload is None:
        specs = [RequestSpec(i, len(g.prompt), g.max_new_tokens) for i, g in enumerate(job.prompts)]
        return "prompts", len(specs), [Request(s, np.asarray(g.prompt, dtype=np.int64), sampling=g.sampling)
                                       for s, g in zip(specs, job.prompts)]
    workload = load("workload", job.workload)
    return workload.name, workload.concurrency, [Request(s, workload.prompt_token_ids(s, deployment.model.vocab_size))
                                                 for s in workload.requests()]


def serve(ctx, job: Job, on_step: Callable | None = None) -> RunSummary | None:
    """Serve ``job`` on this rank; rank 0 returns the run's summary, the others None.

    ``on_step(ctx, step)`` runs on every rank before each step (instrumentation, fault injection)."""
    # torch 2.13 deprecates the all-gather the collectives use; 2.11 (the device machine) lacks its successor
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*deprecated", category=FutureWarning)
    deployment = deployment_of(job)
    served, concurrency, requests = _requests(job, deployment)
    policy = make_policy(job.policy, deployment, job.precopy_steps if job.switch_mode == "auto" else 0)
    capacity = plan_capacity(deployment, concurrency, [r.reserved_tokens for r in requests], job.kv_pages,
                             policy.layouts)
    group = build(ctx, deployment, capacity, policy, max_rows_per_owner=concurrency,
                  max_context=max(r.reserved_tokens for r in requests), prefill_rows=job.prefill_chunk)
    lead = ctx.rank == 0
    controller = hooks = None
    if lead:
        if job.progress and "graphs" in group.load_report:  # what start-up captured, before the first step
            print(group.load_report["graphs"]["line"], file=sys.stderr, flush=True)
        controller = Controller(requests, policy, capacity, concurrency=concurrency,
                                prefill_chunk=job.prefill_chunk, layout=policy.initial)
        hooks = _ProgressHooks(controller, Progress(sum(r.spec.max_new_tokens for r in requests), len(requests),
                                                    job.progress))
    ctx.collectives.barrier()
    start = time.perf_counter()
    try:
        reports = run_steps(ctx, group, controller, job.switch_mode, hooks, on_step, job.precopy_steps, job.overlap)
    finally:
        if hooks is not None:
            hooks.close()
    elapsed = time.perf_counter() - start
    _note_captures_while_serving(group)
    _note_moe_dispatch(group)
    everyone = ctx.collectives.all_gather_object((reports, group.load_report))
    if not lead:
        return None
    del group  # the reference check needs the memory on an accelerator
    check = _reference_check(job, deployment, controller, ctx.device) if job.check else None
    load_report = {**everyone[0][1], "seconds_slowest_rank": max(r[1]["seconds"] for r in everyone)}
    return _summary(ctx, deployment, served, policy, job, capacity, controller, elapsed,
                    [r[0] for r in everyone], check, load_report)


def _note_captures_while_serving(group) -> None:
    """Add to the load report the decode graphs captured after start-up (bucket or width changes
    and switches)."""
    graphs = group.model.graphs
    if graphs is None:
        return
    started = group.load_report["graphs"]
    later = graphs.captures[len(started["start_up"]):]
    started["while_serving"] = {"captures": len(later), "seconds": float(sum(c["seconds"] for c in later)),
                                "why": sorted({c["why"] for c in later})}


def _note_moe_dispatch(group) -> None:
    """Add to the load report, where MoE layers may dispatch by all-to-all, the rule and how many of
    their layer-steps did (rank 0's count: every rank takes the same path)."""
    rule = group.model.config.moe_dispatch
    if rule.mode == "all_reduce":
        return
    steps = sum(getattr(mlp, "dispatched", 0) for mlp in group.model.mlps)
    starts = ", ".join(f"{l} from {n:,} rows" for l, n in rule.from_rows) or "never"
    group.load_report["moe_dispatch"] = {
        "mode": rule.mode, "from_rows": {str(l): n for l, n in rule.from_rows}, "all_to_all_layer_steps": steps,
        "line": f"MoE dispatch {rule.mode}: all-to-all {starts}; {steps:,} MoE layer-steps dispatched so"}


def _reference_check(job: Job, deployment, controller: Controller, device) -> dict:
    """The finished requests' outputs against the single-device reference (rank 0)."""
    finished = [r for r in controller.requests.values() if r.state is State.FINISHED]
    result = reference_check.check(deployment, {r.id: r.prompt for r in finished},
                                   {r.id: r.generated for r in finished}, device, tolerance=job.check_tolerance,
                                   sampling={r.id: r.sampling for r in finished})
    return {**dataclasses.asdict(result), "line": result.line()}


class _ProgressHooks(Hooks):
    """A run's progress bar, redrawn after every step."""

    def __init__(self, controller: Controller, progress: Progress):
        self.controller, self.progress = controller, progress

    def after_step(self, plan, produced, seconds, switch) -> None:
        self._draw(plan.step)

    def close(self) -> None:
        self._draw(len(self.controller.steps))
        self.progress.close()

    def _draw(self, step: int) -> None:
        reqs = self.controller.requests.values()
        self.progress.update(done=sum(r.done for r in reqs), generated=sum(len(r.generated) for r in reqs), step=step,
                             layout=self.controller.layout,
                             switches=sum(not s.refused for s in self.controller.switches))


def _summary(ctx, deployment, served, policy, job, capacity, controller, elapsed, reports, check,
             load_report) -> RunSummary:
    requests = list(controller.requests.values())
    finished = [r for r in requests if r.state is State.FINISHED]
    by_step = _merge_reports(reports)
    switches = []
    for rec in controller.switches:
        merged = by_step.get(rec.step, {}) if not rec.refused else {}
        switches.append(SwitchSummary(rec.step, str(rec.src), str(rec.dst), rec.reason, rec.refused, **merged,
                                      precopy=rec.precopy.as_dict() if rec.precopy is not None else {}))
    outputs = tuple({"id": r.id, "prompt_token_ids": [int(t) for t in r.prompt], "token_ids": list(r.generated),
                     "finish_reason": r.finish_reason} for r in requests) if job.prompts else ()
    return RunSummary(
        deployment=deployment.name, workload=served, policy=policy.name, backend=ctx.backend.name,
        device=str(ctx.device), model=deployment.model.name, T=deployment.T,
        layers=deployment.layers or deployment.model.num_layers, compute_dtype=deployment.compute_dtype,
        kv_pages=capacity.pages, kv_pages_source=capacity.source, prefill_chunk=job.prefill_chunk,
        requests=len(requests), served=len(finished),
        rejected=tuple({"id": r.id, "reason": r.reason} for r in requests if r.state is State.REJECTED),
        prompt_tokens=sum(r.prompt_tokens for r in finished), output_tokens=sum(len(r.generated) for r in finished),
        elapsed_s=elapsed, switches=tuple(switches), decisions=dict(controller.decisions), check=check,
        load=load_report, outputs=outputs, **_step_fields(controller.steps), latency=latency(finished),
        precopies=tuple(r.as_dict() for r in controller.precopies), precopy_counts=precopy_counts(controller.precopies))


def _step_fields(steps) -> dict:
    """The summary's per-step fields from the controller's step records."""
    layout_steps: dict[str, int] = {}
    for s in steps:
        layout_steps[str(s.layout)] = layout_steps.get(str(s.layout), 0) + 1
    return dict(steps=len(steps), layout_steps=layout_steps, step_ms=tuple(s.seconds * 1e3 for s in steps),
                step_rows=tuple(s.rows for s in steps), step_requests=tuple(s.requests for s in steps),
                booked=dict(collections.Counter(s.booked for s in steps)),
                step_device_ms=tuple(None if s.device_seconds is None else s.device_seconds * 1e3 for s in steps))


def _merge_reports(per_rank: list[list]) -> dict[int, dict]:
    """{step: SwitchSummary fields} from every rank's executor reports: bytes moved over the
    group (each report carries the group's total), times of the slowest rank."""
    out: dict[int, dict] = {}
    for reports in per_rank:
        for step, report in reports:
            entry = out.setdefault(step, {"mode": str(report.mode), "bytes": dict(report.bytes_group),
                                          "exposed_ms": 0.0, "step_ms": 0.0})
            entry["exposed_ms"] = max(entry["exposed_ms"], float(report.exposed_ms))
            entry["step_ms"] = max(entry["step_ms"], float(report.step_ms))
    return out
