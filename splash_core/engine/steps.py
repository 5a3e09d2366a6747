"""The step loop every rank runs, for a workload (:func:`~splash_core.engine.engine.serve`) and
for a server (:func:`~splash_core.engine.live.serve_live`) alike.

Every step, rank 0 decides (:class:`~splash_core.engine.controller.Controller`: admission,
batch composition, the policy's layout) and broadcasts a compact plan
(:mod:`~splash_core.engine.plan`); every rank then frees the pages of finished and aborted
requests and runs the step: :meth:`Model.step <splash_core.runtime.model.Model.step>` in the
current layout, or, when the plan names another layout, the switch executor's step, during
which every layer moves to it while the batch keeps computing (with ``switch_mode="precopy"``,
a pre-copy over ``precopy_steps`` steps first, then the handoff: :mod:`~splash_core.engine.precopies`).
Every rank chooses the step's
tokens on its device (the logits are identical on every rank): the argmax, or for a sampled or
adjusted output the draw the plan carries, from logits adjusted by the request's token history,
which every rank keeps on its device (:mod:`~splash_core.runtime.sampling`,
:mod:`~splash_core.runtime.token_history`); rank 0 books them, with the logprobs of the
requests that asked, computed on its device in the same step (:mod:`~splash_core.engine.logprobs`). A
step in the current layout is booked *ahead*: rank 0 plans the next step before its tokens
reach the host, that plan feeds them by reference to the device's tokens, and rank 0 waits for
them only once the next step is queued behind it (issue 22 §3; ``overlap=False`` books every
step first). A switch the
executor refuses before anything moves (Eq 5) runs the step in the current layout instead.
What rank 0 does besides (a progress bar, a server's requests and streamed tokens) comes
through :class:`Hooks`.

Faults stop the group instead of hanging it: collectives time out after the group's timeout
(``deployment.collective_timeout_s`` when launched by :mod:`~splash_core.engine.launch`); a
failure while rank 0 decides is broadcast (ABORT) so the others stop at once; every error says
which rank and step it happened at.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from ..checkpoint.source import weight_source
from ..profiles.deployment import DeploymentProfile
from ..runtime.model import Model
from ..runtime.sampling import apply_draws
from ..runtime.step_tokens import StepTokens
from ..runtime.switch import SwitchExecutor, SwitchRefused
from ..runtime.token_history import TokenHistory
from .controller import Controller
from .device_fit import device_memory, device_memory_problem
from .errors import EngineError
from .expanded_warm_up import warm_deployment
from .logprobs import LogprobJobs, scored_rows
from .plan import Command, StepPlan, exchange
from .precopies import PreCopies


class Hooks:
    """What rank 0 does around the steps it decides, besides deciding them (this base does
    nothing; :mod:`~splash_core.engine.live` feeds a server's requests through it).

    - ``before_plan(controller)``: before each plan, e.g. add and abort requests; may wait for work
      while ``controller.idle`` (no longer than a second: the other ranks wait in the broadcast).
    - ``report_due()``: whether every rank reports its KV pool after the next plan.
    - ``after_plan(plan, pools)``: after each plan's releases; ``pools`` is every rank's
      :func:`pool_usage` when the plan asked for it, else None.
    - ``after_step(plan, produced, seconds, switch)``: after a step was booked; ``produced`` are the
      requests that generated a token in it, ``switch`` the executor's report of a switch, or None.
    """

    def before_plan(self, controller: Controller) -> None:
        pass

    def report_due(self) -> bool:
        return False

    def after_plan(self, plan: StepPlan, pools: list | None) -> None:
        pass

    def after_step(self, plan: StepPlan, produced: list, seconds: float, switch) -> None:
        pass


@dataclasses.dataclass
class Group:
    """One rank's model for a run, its switch executor (None with a single layout) and how it loaded."""

    model: Model
    executor: SwitchExecutor | None
    load_report: dict


def build(ctx, deployment: DeploymentProfile, capacity, policy, *, max_rows_per_owner: int | None = None,
          max_context: int | None = None, prefill_rows: int | None = None) -> Group:
    """Load the deployment's model on this rank with ``capacity.pages`` KV pages per layer, the
    switch executor when the policy may run more than one layout, and, where the model replays
    decode graphs, capture the initial layout's graph of every bucket up to
    ``max_rows_per_owner`` with tables ``max_context`` tokens wide (the load report's
    ``graphs``), so steady-state decode steps never capture; where the expanded-form provider
    builds a graph per shape, warm every shape of chunks of ``prefill_rows`` rows up to
    ``max_context`` (else the pool's tokens) in the policy's layouts (``expanded_warm_up``)."""
    if ctx.world_size != deployment.T:
        raise EngineError(f"rank {ctx.rank}: deployment {deployment.name!r} is for T = {deployment.T}, "
                          f"the group has {ctx.world_size} ranks")
    problem = device_memory_problem(ctx, deployment)
    if problem:
        raise EngineError(problem)
    t_load = time.perf_counter()
    source = weight_source(deployment.model, deployment.seed, deployment.keeps_fp8)
    model = Model.from_deployment(ctx, deployment, pages_per_layer=capacity.pages, layouts=policy.initial,
                                  source=source)
    ctx.streams.synchronize()
    load_report = _load_report(source, time.perf_counter() - t_load, model)
    executor = None
    if len(policy.layouts) > 1:  # Eq 5 against the same budget the scheduler plans with
        executor = SwitchExecutor(model, ctx, budget_bytes=deployment.memory_budget_bytes - deployment.common_bytes,
                                  reserve_bytes=deployment.reserve_bytes, transfer=deployment.transfer)
        _ = executor.io  # create the side communicator now (a collective), not in the first switch's timed step
    if model.graphs is not None:
        made = model.graphs.capture_all(max_rows_per_owner, max_context)
        load_report["graphs"] = {**model.graphs.summary(), "line": model.graphs.describe(), "start_up": made}
    if prefill_rows and model.math is not None and hasattr(model.kernels.expanded, "warm_up"):
        load_report["expanded_warm_up"] = warm_deployment(ctx, deployment, model, policy.layouts, prefill_rows,
                                                          max_context or capacity.pages * deployment.page_size * ctx.world_size)
    return Group(model, executor, load_report)



@dataclasses.dataclass
class _Launched:
    """A step whose work is queued on the device: its plan, its tokens on their way to the
    host, and what rank 0 needs to book it."""

    plan: StepPlan
    tokens: StepTokens
    started: float  # perf_counter when the step was issued
    report: object = None  # the switch executor's report, or None
    refused: str = ""
    copying: bool = False  # ran beside a pre-copy
    ran_in: object = None  # the layout the step ended in
    precopies: tuple = ()  # the pre-copy records that began or ended in the step
    wait: str = ""  # why rank 0 must book it before planning the next step ("": it may book it ahead)
    booked: bool = False
    logprobs: LogprobJobs | None = None  # what rank 0 computed of the step for requests that asked
    timing: tuple = ()  # rank 0: timing events (start, end) around the step's work on the compute stream


def run_steps(ctx, group: Group, controller: Controller | None, switch_mode: str, hooks: Hooks | None = None,
              on_step: Callable | None = None, precopy_steps: int = 4, overlap: bool = True) -> list:
    """Run rank 0's plans on this rank until STOP (``controller`` and ``hooks`` on rank 0 only);
    returns this rank's switch reports as (step, report). ``switch_mode``: splash, blocking,
    precopy (every switch a pre-copy of ``precopy_steps`` steps) or auto (the plan says).

    With ``overlap`` rank 0 plans step k+1 while the device runs step k (issue 22 §3): a step in
    the current layout is booked ahead of its tokens
    (:meth:`Controller.book_ahead`), the next plan feeds its outputs by reference to the device's
    tokens, and rank 0 waits for step k's tokens only once step k+1 is queued behind it. A
    switching step, a pre-copy or a plan that is not a step makes rank 0 wait for
    the tokens first; each step's record says how it was booked."""
    loop = _StepLoop(ctx, group, controller, switch_mode, hooks or Hooks(), on_step, precopy_steps, overlap)
    try:
        while loop.next_plan():
            pass
    except Exception as exc:
        peers = [r for r in range(ctx.world_size) if r != ctx.rank]
        exc.add_note(f"[splash engine] rank {ctx.rank} of {ctx.world_size}, step {loop.step}; collectives time out "
                     f"after {ctx.timeout_s:.0f} s, so a peer (rank {', '.join(map(str, peers))}) that crashed or "
                     f"hung shows up here as a failed collective")
        raise
    return loop.reports


class _StepLoop:
    """The phases of one plan on one rank: book the step in flight (rank 0), receive the plan,
    free what it releases, run the step it names."""

    def __init__(self, ctx, group: Group, controller: Controller | None, switch_mode: str, hooks: Hooks,
                 on_step: Callable | None, precopy_steps: int, overlap: bool):
        self.ctx, self.model, self.executor = ctx, group.model, group.executor
        self.controller, self.hooks, self.on_step = controller, hooks, on_step
        self.lead, self.switch_mode, self.overlap = controller is not None, switch_mode, overlap
        self.precopies = None
        if switch_mode in ("precopy", "auto") and self.executor is not None:
            self.precopies = PreCopies(self.executor, precopy_steps, forced=switch_mode == "precopy")
        self.reports: list = []
        self.history = TokenHistory(self.model.profile.vocab_size, self.model.device)
        self.step = 0
        self.flight: _Launched | None = None  # the last step issued, not yet booked (rank 0); its tokens (every rank)
        self.booked_until = time.perf_counter()  # when rank 0 last booked a step

    def next_plan(self) -> bool:
        """One plan of rank 0's, run on this rank; False once it was STOP."""
        self._book_or_book_ahead()
        plan, tokens = self._receive()
        self._release(plan)
        if plan.command is Command.STOP:
            if self.precopies is not None:
                self.precopies.close(self.step)
            return False
        if plan.command is Command.STEP:
            self._run(plan, tokens)
        return True

    def _book_or_book_ahead(self) -> None:
        """Rank 0, before planning: a step that had to wait is booked now; one in the current layout
        is booked ahead of its tokens (or now, when nothing is left to plan ahead of them: a server
        would wait for work meanwhile)."""
        flight = self.flight
        if not self.lead or flight is None:
            return
        if flight.wait:
            self._book(flight)
            return
        self.controller.book_ahead(flight.plan)
        if self.controller.idle:
            self._book(flight)

    def _receive(self) -> tuple[StepPlan, object]:
        """Rank 0's next plan and the step's tokens (the step in flight's outputs by reference); a
        plan that is not a step books the step in flight first."""
        previous = self.flight.tokens.device if self.flight is not None else None
        plan, tokens = _next_plan(self.ctx, self.controller, self.step, self.model.page_size, self.hooks, previous)
        if plan.command is not Command.STEP:
            if self.lead and self.flight is not None and not self.flight.booked:
                self._book(self.flight)
            self.flight = None
        return plan, tokens

    def _release(self, plan: StepPlan) -> None:
        """Every rank frees the finished and aborted requests' pages (and pre-copies), and reports
        its pool where the plan asks."""
        for rid in plan.releases:
            self.model.release(rid)
            self.history.release(rid)
            if self.precopies is not None:
                self.precopies.release(rid)
        pools = self.ctx.host_collectives().all_gather_object(pool_usage(self.model)) if plan.report else None
        if self.lead:
            self.hooks.after_plan(plan, pools)

    def _run(self, plan: StepPlan, tokens) -> None:
        """Issue the step; rank 0 then books the step before it, now queued behind this one."""
        if self.on_step is not None:
            self.on_step(self.ctx, self.step)
        self.history.feed(plan.requests, tokens, dict(plan.tracked))
        launched = _launch(self.ctx, self.model, self.executor, self.controller, plan, tokens, self.switch_mode,
                           self.precopies, self.history)
        if self.lead and not self.overlap:
            launched.wait = launched.wait or "sync"
        if launched.report is not None:
            self.reports.append((self.step, launched.report))
        if self.lead and self.flight is not None and not self.flight.booked:
            self._book(self.flight)
        self.flight = launched
        self.step += 1

    def _book(self, flight: _Launched) -> None:
        self.booked_until = _book(self.controller, self.hooks, flight, self.booked_until)


def _launch(ctx, model, executor, controller, plan: StepPlan, tokens, switch_mode: str, precopies,
            history: TokenHistory) -> _Launched:
    """Issue ``plan``'s step (its fed tokens already in ``history``); on rank 0, say whether it must
    be booked before the next plan."""
    started = time.perf_counter()
    timing = (model.streams.new_event(timing=True), model.streams.new_event(timing=True)) if controller else ()
    if timing:
        timing[0].record()
    current = model.layers[0].layout
    pick = _picker(plan, history)
    jobs = LogprobJobs.of(plan, controller.requests) if controller is not None else None
    report = jobs.compute if jobs is not None else None
    with model.scoring(scored_rows(plan)):
        if plan.layout is current and (precopies is None or precopies.active is None):
            launched = _Launched(plan, model.step_tokens(plan.batch(model.T, model.page_size), tokens, pick, report),
                                 started)
        else:
            if precopies is not None:
                every, switched, refused, copying = precopies.run(plan, tokens, lambda precopy: _share_switch_plan(
                    ctx, executor, controller, plan, model, precopies.mode, precopy))
            else:
                switch = _share_switch_plan(ctx, executor, controller, plan, model, switch_mode)
                every, switched, refused = _run_step(model, executor, plan, tokens, switch_mode, switch)
                copying = False
            logits = every[: len(plan.requests)]
            chosen = logits.argmax(dim=-1) if pick is None else pick(logits.argmax(dim=-1), logits)
            launched = _Launched(plan, StepTokens.start(chosen, lambda: logits, model.streams,
                                                        None if report is None else report(chosen, every)), started,
                                 switched, refused, copying, precopies=tuple(precopies.events) if precopies else (),
                                 wait="switch" if plan.layout is not current and not copying else "precopy")
    launched.ran_in, launched.logprobs = model.layers[0].layout, jobs
    if timing:
        timing[1].record()
        launched.timing = timing
    return launched


def _picker(plan: StepPlan, history: TokenHistory):
    """``pick(greedy, logits)`` of the plan's draws (None without draws), their histories read
    from ``history`` where a draw adjusts by one."""
    if not plan.draws:
        return None
    rows = history.rows([d.request for d in plan.draws]) if any(d.request >= 0 for d in plan.draws) else None
    return lambda greedy, logits: apply_draws(greedy, logits, plan.draws, rows)


def _book(controller: Controller, hooks: Hooks, flight: _Launched, since: float) -> float:
    """Rank 0 books ``flight``; returns when. One that had to wait (``flight.wait``) is booked
    before the next plan; one booked ahead gets its tokens confirmed. Either waits for the
    step's event only (its tokens, greedy or sampled, were chosen on the device). A step's seconds are its
    share of the run's wall time: from when it was issued or the step before was booked,
    whichever is later, to its booking; its device seconds those between its timing events."""
    next_tokens = flight.tokens.host()
    done = time.perf_counter()
    seconds = done - max(flight.started, since)
    device_seconds = None
    if flight.timing:
        flight.timing[1].synchronize()
        device_seconds = flight.timing[0].elapsed_time(flight.timing[1]) / 1e3
    flight.booked = True
    if flight.wait:
        produced = controller.record(flight.plan, next_tokens, seconds, flight.ran_in, flight.refused,
                                     precopying=flight.copying, precopies=flight.precopies, booked=flight.wait,
                                     device_seconds=device_seconds)
    else:
        produced = controller.confirm(flight.plan, next_tokens, seconds, device_seconds)
    if flight.logprobs is not None:
        flight.logprobs.book(flight.tokens.extra_host(), produced, controller.requests)
    hooks.after_step(flight.plan, produced, seconds, flight.report)
    return done


def pool_usage(model: Model) -> dict:
    """This rank's KV pool: pages per MLA layer, and the pages used and free in its busiest layer."""
    layers = [layer.kv for layer in model.paged_layers]
    if not layers:
        return {"pages": 0, "used": 0, "free": 0}
    used = max(kv.used_pages for kv in layers)
    return {"pages": layers[0].num_pages, "used": used, "free": layers[0].num_pages - used}


def _load_report(source, seconds: float, model: Model) -> dict:
    """How long building the model took, what it read, and what it holds (bytes per part)."""
    read = int(getattr(source, "bytes_read", 0))
    pool = sum(t.numel() * t.element_size() for layer in model.paged_layers
               for t in (layer.kv.kv, layer.kv.indexer) if t is not None)
    held = device_memory(model.device)
    return {"source": "checkpoint" if read else "seeded", "checkpoint": model.profile.checkpoint,
            "device_memory": None if held is None else {"free": int(held[0]), "total": int(held[1])},
            "seconds": seconds, "bytes_read": read, "gb_per_s": read / seconds / 1e9 if seconds > 0 else 0.0,
            "format": model.profile.notes if model.profile.checkpoint else "",
            "memory": {**model.nbytes(), "kv_pool": pool}, "dtype": str(model.dtype).removeprefix("torch.")}


def _next_plan(ctx, controller, step: int, page_size: int, hooks: Hooks, previous=None) -> tuple[StepPlan, object]:
    """Rank 0 plans and broadcasts; the others receive. A failure while planning is broadcast
    as ABORT before rank 0 raises, so no rank waits for a step that never comes."""
    mine = None
    if controller is not None:
        try:
            hooks.before_plan(controller)
            mine = controller.plan(step, ctx.world_size, page_size)
            if hooks.report_due():
                mine = dataclasses.replace(mine, report=True)
        except Exception:
            exchange(ctx.host_collectives(), ctx.device, StepPlan(Command.ABORT, step, controller.layout))
            raise
    plan, tokens = exchange(ctx.host_collectives(), ctx.device, mine, previous)
    if plan.step != step:
        raise EngineError(f"rank {ctx.rank} is at step {step}, rank 0 sent step {plan.step}: the group is out of step")
    if plan.command is Command.ABORT:
        raise EngineError(f"rank {ctx.rank}: rank 0 failed while planning step {step} (see rank 0's error)")
    return plan, tokens


def _share_switch_plan(ctx, executor, controller, plan: StepPlan, model, mode: str, precopy=None):
    """On a switching step, the switch as rank 0 planned it (:meth:`SwitchExecutor.plan_switch`,
    from the scheduler's check of it where the policy's decision carries one: its manifest and
    Eq 5 verdict; Eq 5 always for the handoff of ``precopy``, whose copies count as held),
    broadcast over the host collectives: no other rank plans or checks it again. None on other
    steps."""
    if plan.command is not Command.STEP or plan.layout is model.layers[0].layout:
        return None
    mine = None
    if controller is not None:
        try:
            mine = executor.plan_switch(plan.layout, plan.batch(model.T, model.page_size), mode,
                                        decided=controller.switch_check, precopy=precopy)
        except Exception as exc:
            ctx.host_collectives().broadcast_object(f"{type(exc).__name__}: {exc}", src=0)
            raise
    shared = ctx.host_collectives().broadcast_object(mine, src=0)
    if isinstance(shared, str):
        raise EngineError(f"rank {ctx.rank}: rank 0 failed while planning the switch of step {plan.step}: {shared}")
    return shared


def _run_step(model, executor, plan: StepPlan, tokens, mode: str, switch=None):
    """A switching step: (logits, switch report or None, why the switch was refused or "")."""
    batch = plan.batch(model.T, model.page_size)
    try:
        logits, report = executor.step(batch, tokens, plan.layout, mode=mode, plan=switch)
        return logits, report, ""
    except SwitchRefused as exc:
        return model.step(batch, tokens), None, str(exc)
