"""Serving requests as clients send them (``splash serve``): the engine's side.

:func:`serve_live` runs on every rank of the group, as :func:`~splash_core.engine.engine.serve`
does, through the same step loop (:func:`~splash_core.engine.steps.run_steps`); its controller is
open-ended. On rank 0, :class:`LiveHooks` talks to the server's front end
(:mod:`splash_core.server`) over one :mod:`multiprocessing` connection: before every plan it
takes the requests that arrived, the aborts and the close (waiting up to ``heartbeat_s`` for
them while nothing runs, then planning an IDLE step so the other ranks' broadcast never times
out); after every step it sends what the step produced. An abort takes effect at the next step
boundary: the next plan, IDLE or not, frees the request's pages on every rank.

The messages both ways are :mod:`~splash_core.engine.messages`'; the front end aborts what must not
finish before it closes. If the front end goes away, every request is aborted and the run stops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
import warnings

import numpy as np

from ..profiles.workload import RequestSpec
from .admission import KVCapacity
from .controller import Controller
from .engine import deployment_of
from .logprobs import news as logprob_news
from .messages import AbortRequests, AddRequest, Close, EngineDone, EngineReady, StepReport
from .plan import Command, StepPlan
from .policy import make_policy
from .precopies import HANDED_OFF
from .requests import Request, State
from .steps import Hooks, build, run_steps


@dataclasses.dataclass(frozen=True)
class LiveJob:
    """What ``splash serve`` runs on the group. ``kv_pages`` is fixed by the front end (it checks
    every request against the same pool before sending it); ``conn`` is rank 0's end of the
    connection to the front end (the other ranks ignore theirs)."""

    deployment: object
    conn: object
    kv_pages: int
    max_running: int
    policy: object = "splash"
    prefill_chunk: int = 8192
    switch_mode: str = "splash"
    precopy_steps: int = 4  # steps a pre-copy spans before its handoff ("auto": at most)
    model: str | None = None
    T: int | None = None
    front_end_here: bool = False  # the front end runs in this process (rank 0 under torchrun): it owns the signals
    heartbeat_s: float = 0.5  # longest wait for work before an IDLE plan
    report_interval_s: float = 1.0  # how often every rank reports its KV pool while serving
    overlap: bool = True  # plan step k+1 while the device runs step k (engine.steps.run_steps)


def serve_live(ctx, job: LiveJob) -> dict | None:
    """Serve the front end's requests on this rank until it closes; rank 0 returns the run's totals."""
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*deprecated", category=FutureWarning)
    deployment = deployment_of(job)
    policy = make_policy(job.policy, deployment, job.precopy_steps if job.switch_mode == "auto" else 0)
    capacity = KVCapacity(job.kv_pages, deployment.page_size, deployment.T, "set by the server")
    group = build(ctx, deployment, capacity, policy, max_rows_per_owner=job.max_running,
                  prefill_rows=job.prefill_chunk)
    controller = hooks = None
    if ctx.rank == 0:
        controller = Controller([], policy, capacity, concurrency=job.max_running, prefill_chunk=job.prefill_chunk,
                                layout=policy.initial, open_ended=True, idle_s=job.heartbeat_s)
        hooks = LiveHooks(job.conn, controller, job.heartbeat_s, job.report_interval_s)
    ctx.collectives.barrier()
    if hooks is not None:
        hooks.send(EngineReady(str(policy.initial), policy.name, capacity.pages, group.load_report))
    # ranks ignore SIGTERM and SIGINT while serving: a service manager or a terminal that signals the
    # whole process group must not kill a rank mid-collective; the front end drains and stops the
    # group (a rank whose parent is gone still exits: runtime.spawn)
    with contextlib.nullcontext() if job.front_end_here else stop_signals(signal.SIG_IGN):
        run_steps(ctx, group, controller, job.switch_mode, hooks, precopy_steps=job.precopy_steps, overlap=job.overlap)
    if hooks is None:
        return None
    totals = {"steps": hooks.steps, "switches": hooks.switches, "precopies": dict(controller.precopy_counts)}
    hooks.send(EngineDone(totals))
    return totals


def switch_kind(record) -> str:
    """A :class:`~splash_core.engine.controller.SwitchRecord`'s kind: ``precopy`` (it handed off a
    pre-copy), ``fell_back`` (one step, after a pre-copy that could not hand off) or ``one_step``."""
    if record.precopy is None:
        return "one_step"
    return "precopy" if record.precopy.outcome == HANDED_OFF else "fell_back"


@contextlib.contextmanager
def stop_signals(handler):
    """Inside, SIGTERM and SIGINT go to ``handler`` (``signal.SIG_IGN``: ignored); the previous
    handlers come back on the way out. Only the main thread may set handlers: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


class LiveHooks(Hooks):
    """Rank 0's link to the front end (see the module docstring)."""

    def __init__(self, conn, controller: Controller, heartbeat_s: float, report_interval_s: float):
        self.conn, self.controller = conn, controller
        self.heartbeat_s, self.report_interval_s = heartbeat_s, report_interval_s
        self.watch: set[int] = set()  # requests not done yet
        self.gone = False  # the front end went away
        self.dirty = False  # pages were freed since the pools were last reported
        self.last_report = 0.0
        self.pools = None
        self.pending_rejected: tuple = ()  # found while planning a step, sent after it
        self.steps = self.switches = 0
        self.arrived: dict[int, float] = {}  # requests not scheduled yet: when they arrived (their queue time)

    # ---- before a plan: what the front end sent -------------------------------------------

    def before_plan(self, controller: Controller) -> None:
        if controller.idle and controller.open and not self.gone:
            self._poll(self.heartbeat_s)
        while not self.gone and self._poll(0):
            try:
                self._handle(self.conn.recv())
            except (EOFError, OSError):
                self._lost()
        if self.gone:
            controller.close()

    def _poll(self, timeout: float) -> bool:
        try:
            return self.conn.poll(timeout)
        except (EOFError, OSError):
            self._lost()
            return False

    def _handle(self, message) -> None:
        if isinstance(message, AddRequest):
            prompt = np.asarray(message.prompt_ids, dtype=np.int64)
            self.controller.add(Request(RequestSpec(message.id, len(prompt), message.max_new_tokens), prompt,
                                        sampling=message.sampling, logprobs=message.logprobs,
                                        prompt_logprobs=message.prompt_logprobs))
            self.watch.add(message.id)
            self.arrived[message.id] = time.monotonic()
        elif isinstance(message, AbortRequests):
            self._drop(r.id for r in self.controller.abort(list(message.ids), self.steps))
        elif isinstance(message, Close):
            self.controller.close()
        else:
            raise ValueError(f"unknown message from the front end: {type(message).__name__}")

    def _lost(self) -> None:
        """The front end is gone: nobody is left to stream to."""
        self.gone = True
        self._drop(r.id for r in self.controller.abort(list(self.watch), self.steps))

    def _drop(self, ids) -> None:
        ids = list(ids)
        self.watch.difference_update(ids)
        for rid in ids:
            self.arrived.pop(rid, None)
        self.controller.forget(ids)
        self.dirty = self.dirty or bool(ids)

    # ---- after a plan or a step: what the front end learns --------------------------------

    def report_due(self) -> bool:
        now = time.monotonic()
        return now - self.last_report >= self.report_interval_s or (self.dirty and self.controller.idle)

    def after_plan(self, plan: StepPlan, pools: list | None) -> None:
        if pools is not None:
            self.pools, self.last_report, self.dirty = tuple(pools), time.monotonic(), False
        rejected = self._rejected()
        if plan.command is Command.IDLE and (pools is not None or rejected):
            self.send(StepReport(plan.step, str(self.controller.layout), rejected=rejected,
                                 waiting=len(self.controller.queue), pools=self._take_pools()))
        else:
            self.pending_rejected = rejected

    def after_step(self, plan: StepPlan, produced: list, seconds: float, switch) -> None:
        c = self.controller
        scores = logprob_news(plan, produced, c.requests)
        finished = tuple((r.id, r.finish_reason) for r in produced if r.state is State.FINISHED)
        finished += scores.pop("finished")  # requests that only scored their prompt
        switches = tuple({"src": str(s.src), "dst": str(s.dst), "reason": s.reason, "refused": s.refused,
                          "exposed_ms": float(switch.exposed_ms) if switch is not None and not s.refused else 0.0,
                          "kind": switch_kind(s), "precopy": s.precopy.as_dict() if s.precopy is not None else {}}
                         for s in c.switches)
        self.steps += 1
        self.switches += sum(not s["refused"] for s in switches)
        began = time.monotonic() - seconds
        queued = tuple((q.id, began - self.arrived.pop(q.id)) for q in plan.requests if q.id in self.arrived)
        report = StepReport(plan.step, str(c.layout), seconds, self._phase(plan, switch), int(sum(q.rows for q in plan.requests)),
                            tuple((r.id, r.generated[-1]) for r in produced), finished,
                            self.pending_rejected, switches, len(c.queue), len(c.running),
                            self._take_pools(), tuple(r.as_dict() for r in c.precopy_events), queued=queued, **scores)
        self.pending_rejected = ()
        self._drop(rid for rid, _ in finished)
        c.steps.clear()  # a server runs for days: keep no per-step history here
        c.switches.clear()
        c.precopies.clear()
        self.send(report)

    def _phase(self, plan: StepPlan, switch) -> str:
        if switch is not None:
            return "switch"
        requests = self.controller.requests  # a request that stopped the step before may be forgotten already
        prefill = [q.start < requests[q.id].prompt_tokens for q in plan.requests if q.id in requests]
        return "decode" if not any(prefill) else "prefill" if all(prefill) else "mixed"

    def _rejected(self) -> tuple:
        out = tuple((rid, self.controller.requests[rid].reason) for rid in self.watch
                    if self.controller.requests[rid].state is State.REJECTED)
        self._drop(rid for rid, _ in out)
        return out

    def _take_pools(self):
        pools, self.pools = self.pools, None
        return pools

    def send(self, message) -> None:
        if self.gone:
            return
        try:
            self.conn.send(message)
        except (BrokenPipeError, EOFError, OSError):
            self._lost()
