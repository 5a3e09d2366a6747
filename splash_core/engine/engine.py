"""The serving engine's step loop, run identically on every rank of the group.

Every step, rank 0 decides (:class:`~splash_core.engine.controller.Controller`: admission,
batch composition, the policy's layout) and broadcasts a compact plan
(:mod:`~splash_core.engine.plan`); every rank then frees the pages of finished requests and
runs the step: :meth:`Model.step <splash_core.runtime.model.Model.step>` in the current layout,
or, when the plan names another layout, the switch executor's step, during which every layer
moves to it while the batch keeps computing. From the logits (identical on every rank) rank 0
chooses each request's next token (:mod:`~splash_core.engine.sampling`: greedy or seeded
sampling) and books it; the next plan carries it to every rank. A switch the executor refuses
before anything moves (Eq 5) runs the step in the current layout instead.

Faults stop the group instead of hanging it: collectives time out after the group's timeout
(``deployment.collective_timeout_s`` when launched by :mod:`~splash_core.engine.launch`); a
failure while rank 0 decides is broadcast (ABORT) so the others stop at once; every error says
which rank and step it happened at.

:func:`serve` is a module-level function taking the rank's context first, so it runs under
torchrun and inside a :class:`~splash_core.runtime.spawn.RankPool` worker alike.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Callable

import numpy as np
import torch

from ..checkpoint.deployments import resolve
from ..checkpoint.source import weight_source
from ..profiles import load
from ..profiles.deployment import DeploymentProfile
from ..profiles.workload import RequestSpec
from ..runtime.model import Model
from ..runtime.switch import SwitchExecutor, SwitchRefused
from . import reference_check
from .admission import plan_capacity
from .controller import Controller
from .plan import Command, StepPlan, exchange
from .policy import make_policy
from .progress import Progress
from .requests import GenerationRequest, Request, State
from .sampling import GREEDY, next_tokens as choose_tokens
from .summary import RunSummary, SwitchSummary


class EngineError(RuntimeError):
    """The run stopped: names the rank and step."""


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
    switch_mode: str = "splash"  # how the executor moves state: "splash" (layer-pipelined) or "blocking"
    check: bool = True  # compare outputs with the single-device reference (rank 0, after the run)
    check_tolerance: float | None = None  # for compute formats below float32 (None: the default)
    progress: bool = False  # progress bar on rank 0's stderr
    prompts: tuple[GenerationRequest, ...] = ()  # requests by prompt ids (instead of a workload)
    model: str | None = None  # a checkpoint folder to serve instead of the deployment's model
    T: int | None = None  # a group size instead of the deployment's

    def __post_init__(self):
        if (self.workload is None) == (not self.prompts):
            raise ValueError("a job serves either a workload or prompts")


def deployment_of(job: Job) -> DeploymentProfile:
    """The job's deployment with its replacements."""
    return resolve(job.deployment, model=job.model, T=job.T)


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
    if ctx.world_size != deployment.T:
        raise EngineError(f"rank {ctx.rank}: deployment {deployment.name!r} is for T = {deployment.T}, "
                          f"the group has {ctx.world_size} ranks")
    served, concurrency, requests = _requests(job, deployment)
    capacity = plan_capacity(deployment, concurrency, [r.reserved_tokens for r in requests], job.kv_pages)
    policy = make_policy(job.policy, deployment)
    t_load = time.perf_counter()
    source = weight_source(deployment.model, deployment.seed)
    model = Model.from_deployment(ctx, deployment, pages_per_layer=capacity.pages, layouts=policy.initial,
                                  source=source)
    ctx.streams.synchronize()
    load_report = _load_report(source, time.perf_counter() - t_load, model)
    executor = None
    if len(policy.layouts) > 1:  # Eq 5 against the same budget the scheduler plans with
        executor = SwitchExecutor(model, ctx, budget_bytes=deployment.memory_budget_bytes - deployment.common_bytes,
                                  reserve_bytes=deployment.reserve_bytes, transfer=deployment.transfer)
        _ = executor.io  # create the side communicator now (a collective), not in the first switch's timed step
    lead = ctx.rank == 0
    controller = progress = None
    if lead:
        controller = Controller(requests, policy, capacity, concurrency=concurrency,
                                prefill_chunk=job.prefill_chunk, layout=policy.initial)
        progress = Progress(sum(r.spec.max_new_tokens for r in requests), len(requests), job.progress)
    reports = []
    ctx.collectives.barrier()
    start = time.perf_counter()
    step = 0
    try:
        while True:
            plan, tokens = _next_plan(ctx, controller, step, deployment.page_size)
            for rid in plan.releases:
                model.release(rid)
            if plan.command is Command.STOP:
                break
            if on_step is not None:
                on_step(ctx, step)
            t0 = time.perf_counter()
            switch = _share_switch_plan(ctx, executor, controller, plan, model, job.switch_mode)
            logits, report, refused = _run_step(model, executor, plan, tokens, job.switch_mode, switch)
            next_tokens = _choose(controller, plan, logits) if lead else None
            seconds = time.perf_counter() - t0
            if report is not None:
                reports.append((step, report))
            if lead:
                controller.record(plan, next_tokens, seconds, model.layers[0].layout, refused)
                _draw(progress, controller, step)
            step += 1
    except Exception as exc:
        peers = [r for r in range(ctx.world_size) if r != ctx.rank]
        exc.add_note(f"[splash engine] rank {ctx.rank} of {ctx.world_size}, step {step}; collectives time out after "
                     f"{ctx.timeout_s:.0f} s, so a peer (rank {', '.join(map(str, peers))}) that crashed or hung "
                     f"shows up here as a failed collective")
        raise
    finally:
        if progress is not None:
            _draw(progress, controller, step)
            progress.close()
    elapsed = time.perf_counter() - start
    everyone = ctx.collectives.all_gather_object((reports, load_report))
    if not lead:
        return None
    del model, executor  # the reference check needs the memory on an accelerator
    check = None
    if job.check:
        finished = [r for r in controller.requests.values() if r.state is State.FINISHED]
        result = reference_check.check(deployment, {r.id: r.prompt for r in finished},
                                       {r.id: r.generated for r in finished}, ctx.device,
                                       tolerance=job.check_tolerance,
                                       sampling={r.id: r.sampling for r in finished})
        check = {**dataclasses.asdict(result), "line": result.line()}
    load_report = {**load_report, "seconds_slowest_rank": max(r[1]["seconds"] for r in everyone)}
    return _summary(ctx, deployment, served, policy, job, capacity, controller, elapsed,
                    [r[0] for r in everyone], check, load_report)


def _choose(controller: Controller, plan: StepPlan, logits):
    """Rank 0: each request's next token; rows that yield no output (mid-prompt) take argmax."""
    reqs = [controller.requests[q.id] for q in plan.requests]
    params = [r.sampling if r.outputs_this_step(q.rows) else GREEDY for r, q in zip(reqs, plan.requests)]
    return choose_tokens(logits, params, [r.id for r in reqs], [len(r.generated) for r in reqs])


def _load_report(source, seconds: float, model: Model) -> dict:
    """How long building the model took, what it read, and what it holds (bytes per part)."""
    read = int(getattr(source, "bytes_read", 0))
    pool = sum(t.numel() * t.element_size() for layer in model.paged_layers
               for t in (layer.kv.kv, layer.kv.indexer) if t is not None)
    where = torch.device(model.device)
    module = torch.get_device_module(where) if where.type != "cpu" else None
    held = module.mem_get_info(where) if module is not None and hasattr(module, "mem_get_info") else None
    return {"source": "checkpoint" if read else "seeded", "checkpoint": model.profile.checkpoint,
            "device_memory": None if held is None else {"free": int(held[0]), "total": int(held[1])},
            "seconds": seconds, "bytes_read": read, "gb_per_s": read / seconds / 1e9 if seconds > 0 else 0.0,
            "format": model.profile.notes if model.profile.checkpoint else "",
            "memory": {**model.nbytes(), "kv_pool": pool}, "dtype": str(model.dtype).removeprefix("torch.")}


def _next_plan(ctx, controller, step: int, page_size: int) -> tuple[StepPlan, object]:
    """Rank 0 plans and broadcasts; the others receive. A failure while planning is broadcast
    as ABORT before rank 0 raises, so no rank waits for a step that never comes."""
    mine = None
    if controller is not None:
        try:
            mine = controller.plan(step, ctx.world_size, page_size)
        except Exception:
            exchange(ctx.collectives, ctx.device, StepPlan(Command.ABORT, step, controller.layout))
            raise
    plan, tokens = exchange(ctx.collectives, ctx.device, mine)
    if plan.step != step:
        raise EngineError(f"rank {ctx.rank} is at step {step}, rank 0 sent step {plan.step}: the group is out of step")
    if plan.command is Command.ABORT:
        raise EngineError(f"rank {ctx.rank}: rank 0 failed while planning step {step} (see rank 0's error)")
    return plan, tokens


def _share_switch_plan(ctx, executor, controller, plan: StepPlan, model, mode: str):
    """On a switching step, the switch as rank 0 planned it (:meth:`SwitchExecutor.plan_switch`,
    Eq 5 checked there unless the policy's decision already did), broadcast over the host
    collectives: no other rank plans or checks it again. None on other steps."""
    if plan.command is not Command.STEP or plan.layout is model.layers[0].layout:
        return None
    mine = None
    if controller is not None:
        try:
            mine = executor.plan_switch(plan.layout, plan.batch(model.T, model.page_size), mode,
                                        check_eq5=not controller.eq5_checked)
        except Exception as exc:
            ctx.host_collectives().broadcast_object(f"{type(exc).__name__}: {exc}", src=0)
            raise
    shared = ctx.host_collectives().broadcast_object(mine, src=0)
    if isinstance(shared, str):
        raise EngineError(f"rank {ctx.rank}: rank 0 failed while planning the switch of step {plan.step}: {shared}")
    return shared


def _run_step(model, executor, plan: StepPlan, tokens, mode: str, switch=None):
    """(logits, switch report or None, why a switch was refused or "")."""
    batch = plan.batch(model.T, model.page_size)
    if plan.layout is model.layers[0].layout:
        return model.step(batch, tokens), None, ""
    try:
        logits, report = executor.step(batch, tokens, plan.layout, mode=mode, plan=switch)
        return logits, report, ""
    except SwitchRefused as exc:
        return model.step(batch, tokens), None, str(exc)


def _draw(progress: Progress, controller: Controller, step: int) -> None:
    reqs = controller.requests.values()
    progress.update(done=sum(r.state in (State.FINISHED, State.REJECTED) for r in reqs),
                    generated=sum(len(r.generated) for r in reqs), step=step, layout=controller.layout,
                    switches=sum(not s.refused for s in controller.switches))


def _summary(ctx, deployment, served, policy, job, capacity, controller, elapsed, reports, check,
             load_report) -> RunSummary:
    requests = list(controller.requests.values())
    finished = [r for r in requests if r.state is State.FINISHED]
    by_step = _merge_reports(reports)
    switches = []
    for rec in controller.switches:
        merged = by_step.get(rec.step, {}) if not rec.refused else {}
        switches.append(SwitchSummary(rec.step, str(rec.src), str(rec.dst), rec.reason, rec.refused, **merged))
    layout_steps: dict[str, int] = {}
    for s in controller.steps:
        layout_steps[str(s.layout)] = layout_steps.get(str(s.layout), 0) + 1
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
        elapsed_s=elapsed, steps=len(controller.steps), layout_steps=layout_steps,
        step_ms=tuple(s.seconds * 1e3 for s in controller.steps), switches=tuple(switches),
        decisions=dict(controller.decisions), check=check, load=load_report, outputs=outputs,
        step_rows=tuple(s.rows for s in controller.steps), step_requests=tuple(s.requests for s in controller.steps))


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
