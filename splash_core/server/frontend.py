"""The server's front end: the requests in flight, the link to rank 0's engine loop, and the
server's state (loading, ready, draining, failed).

Requests reach rank 0 as :class:`~splash_core.engine.messages.AddRequest` messages over one :mod:`multiprocessing` connection (a writer
thread sends them, so a large prompt never blocks the event loop while rank 0 is mid-step);
rank 0's step reports come back on a reader thread and are handed to the event loop, which
turns each generated token into text (:class:`~splash_core.server.text.TextStream`) and puts
it on the request's queue, from which its HTTP response streams. A request whose client went
away, or whose text reached a stop string, is aborted: rank 0 drops it at the next step
boundary and every rank frees its pages (:mod:`splash_core.engine.live`).

States: ``loading`` until every rank has loaded the model; ``ready``; ``draining`` after a
stop signal (no new requests; in-flight ones finish, or are aborted when the grace period
ends); ``failed`` when a rank crashed or hung (every request in flight ends with the cause,
new ones get 503 with it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import queue
import threading
import time

from ..engine.messages import AbortRequests, AddRequest, Close, EngineDone, EngineReady, StepReport
from .metrics import Metrics
from .protocol import ApiError, Call, Served
from .text import TextStream


@dataclasses.dataclass(eq=False)
class Handle:
    """One request in flight, on the event loop."""

    id: int
    call: Call
    arrived: float  # time.monotonic()
    events: asyncio.Queue  # ("token", text piece, token id or None, finish reason or None) ..., or ("error", ApiError)
    text: TextStream
    token_ids: list = dataclasses.field(default_factory=list)
    token_times: list = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    logprobs: list = dataclasses.field(default_factory=list)  # TokenLogprob per generated token (call.logprobs)
    # call.echo: one entry per prompt token, aligned with call.prompt_ids: None for the first, then TokenLogprob
    prompt_logprobs: list | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def usage(self) -> dict:
        prompt, completion = len(self.call.prompt_ids), len(self.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Frontend:
    """Requests in flight and the link to rank 0 (see the module docstring)."""

    def __init__(self, served: Served, conn, info: dict):
        self.served, self.conn, self.info = served, conn, dict(info)
        self.metrics = Metrics(served.model)
        self.state, self.cause = "loading", ""
        self.layout, self.pools = info.get("layout", ""), ()
        self.waiting = self.running = 0  # rank 0's last report
        self.handles: dict[int, Handle] = {}
        self.ids = itertools.count()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_ready = threading.Event()
        self.engine_ready = threading.Event()
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._write, daemon=True, name="splash-link-writer").start()
        threading.Thread(target=self._read, daemon=True, name="splash-link-reader").start()

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the HTTP server runs on (its lifespan starts)."""
        self.loop = loop
        self.loop_ready.set()

    # ---- requests ---------------------------------------------------------------------

    def check_open(self) -> None:
        """Raise the 503 a new request gets while the server cannot take it."""
        if self.state == "ready":
            return
        why = {"loading": "the model is still loading", "draining": "the server is shutting down",
               "failed": f"the engine failed: {self.cause}"}[self.state]
        raise ApiError(503, why, kind="service_unavailable", code=self.state)

    def submit(self, call: Call) -> Handle:
        self.check_open()
        text = TextStream(self.served.tokenizer, call.stop, call.include_stop)
        handle = Handle(next(self.ids), call, time.monotonic(), asyncio.Queue(), text)
        self.handles[handle.id] = handle
        self.outbox.put(AddRequest(handle.id, call.prompt_ids, call.max_new_tokens, call.sampling,
                                   logprobs=call.logprobs, prompt_logprobs=(call.logprobs or 0) if call.echo else None))
        return handle

    def abort(self, handle: Handle) -> None:
        """The client went away (or the server stops): rank 0 drops the request at the next step."""
        if handle.done:
            return
        self.outbox.put(AbortRequests((handle.id,)))
        self._end(handle, "abort", "aborted")

    def drain(self) -> None:
        """Stop taking requests; rank 0 stops once the ones in flight are done (thread-safe)."""
        if self.state in ("loading", "ready"):
            self.state = "draining"
            self.outbox.put(Close())

    def abort_all(self) -> None:
        """Abort every request in flight (the grace period ended; thread-safe)."""
        self._soon(lambda: [self.abort(h) for h in list(self.handles.values())])

    def fail(self, cause: str) -> None:
        """The engine stopped: end every request with the cause; new ones get 503 (thread-safe)."""
        self.state, self.cause = "failed", cause
        error = ApiError(503, f"the engine failed: {cause}", kind="service_unavailable", code="engine_failed")
        self._soon(lambda: [self._end(h, None, "failed", error) for h in list(self.handles.values())])

    @property
    def in_flight(self) -> int:
        return len(self.handles)

    # ---- rank 0's reports (on the event loop) -------------------------------------------

    def _on_message(self, message) -> None:
        if isinstance(message, EngineReady):
            self.layout = message.layout
            self.info.update(kv_pages=message.kv_pages, policy=message.policy,
                             graphs=message.load.get("graphs", {}).get("line", ""))
            self.metrics.set_layout(self.layout)
            if self.state == "loading":
                self.state = "ready"
            self.engine_ready.set()
        elif isinstance(message, StepReport):
            self._on_step(message)

    def _on_step(self, report) -> None:
        self.metrics.on_step(report)
        self.layout, self.waiting, self.running = report.layout, report.waiting, report.running
        if report.pools is not None:
            self.pools = report.pools
        now, finished, logprobs = time.monotonic(), dict(report.finished), dict(report.logprobs)
        for rid, entries in report.prompt_logprobs:  # before the first token: its event may end the request
            if rid in self.handles:
                self.handles[rid].prompt_logprobs = list(entries)
        for rid, token in report.tokens:
            handle = self.handles.get(rid)
            if handle is None:
                continue  # aborted here already
            if rid in logprobs:
                handle.logprobs.append(logprobs[rid])
            handle.token_ids.append(int(token))
            handle.token_times.append(now)
            self.metrics.generated.inc()
            try:
                piece = handle.text.push(token)
            except Exception as exc:  # never leave a client waiting on a request this loop cannot serve
                self.outbox.put(AbortRequests((rid,)))
                self._end(handle, None, "failed", ApiError(500, f"internal error while decoding: {exc}",
                                                           kind="internal_error"))
                continue
            reason = "stop" if handle.text.stopped else finished.get(rid)
            if reason is not None:
                piece += handle.text.flush()
            handle.events.put_nowait(("token", piece, int(token), reason))
            if handle.text.stopped and rid not in finished:
                self.outbox.put(AbortRequests((rid,)))  # the engine does not know the text reached a stop string
            if reason is not None:
                self._end(handle, reason, "finished", emit=False)
        for rid in set(finished) - {rid for rid, _ in report.tokens}:  # scored its prompt only (max_new_tokens 0)
            if rid in self.handles:
                self._end(self.handles[rid], finished[rid], "finished")
        for rid, reason in report.rejected:
            handle = self.handles.get(rid)
            if handle is not None:
                self._end(handle, None, "rejected", ApiError(400, f"rejected: {reason}", "max_tokens",
                                                             code="kv_capacity_exceeded"))

    def _end(self, handle: Handle, reason: str | None, state: str, error: ApiError | None = None,
             emit: bool = True) -> None:
        """Book the end of a request; ``emit`` its last event (the last token's event carried it already)."""
        if handle.done:
            return
        handle.finish_reason = reason or "error"
        self.handles.pop(handle.id, None)
        self.metrics.on_end(state, len(handle.call.prompt_ids), handle.arrived, handle.token_times,
                             handle.finish_reason)
        if emit:
            handle.events.put_nowait(("error", error) if error is not None else ("token", "", None, reason))

    # ---- the link's threads -----------------------------------------------------------

    def _soon(self, fn) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn)

    def _write(self) -> None:
        while True:
            message = self.outbox.get()
            try:
                self.conn.send(message)
            except (BrokenPipeError, EOFError, OSError):
                return  # rank 0 is gone: the launcher reports why

    def _read(self) -> None:
        self.loop_ready.wait()
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return
            if isinstance(message, EngineDone):
                return
            self._soon(lambda m=message: self._on_message(m))
