"""Running ``splash serve``: the HTTP server, the group, and how they stop.

Where HTTP lives: in the process that starts the group, beside its ranks, not inside one. When
``splash serve`` spawns the ranks (a :class:`~splash_core.runtime.spawn.RankPool`), that is the
parent process: uvicorn serves the Starlette app on a thread of it, and the main thread
supervises the ranks. Requests reach rank 0 over one :mod:`multiprocessing` connection, handed
to rank 0 with the job; rank 0 reads it between steps and sends back each step's tokens
(:mod:`splash_core.engine.live`). Why not inside rank 0: the parent is the process that learns
when any rank crashes (a rank killed outright cannot report its own death, and the pool then
stops every rank), so only there can the server still answer 503 with the cause and exit
non-zero; and tokenizing, rendering and streaming stay off the GIL of the process that drives
the device. Under torchrun there is no such parent: rank 0's process hosts the front end on a
thread and runs the engine on its main thread, through the same connection; stop it with SIGTERM
to rank 0's process (a signal to torchrun itself makes torchrun terminate its workers at once).

Stopping: the first SIGTERM or SIGINT stops admitting (new requests get 503), lets the requests
in flight finish for ``grace_s`` seconds, aborts what is left, stops every rank and exits 0; a
second signal aborts every request in flight, stops the ranks and exits at once (128 + the
signal's number, as a shell reports a process a signal ended), saying so in one line. A rank
that crashes or hangs (collectives time out after ``collective_timeout_s``): every request in
flight ends with the cause, new ones get 503 with it for :data:`FAULT_LINGER_S` seconds (so
clients and health probes learn why), then the server exits 1. The ranks never outlive the
server: the pool stops them, and a rank whose parent is gone exits by itself.

Logging: through :mod:`logging` (the CLI configures it: timestamps, ``--log-level``), on the
logger :data:`~splash_core.server.metrics.LOGGER`; uvicorn's loggers (one line per request at
info) go the same way. Besides start, stop and faults: one line per layout switch
(:mod:`~splash_core.server.metrics`) and every ``stats_interval_s`` a stats line while the server
is busy.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import socket
import threading
import time

from ..engine.launch import under_torchrun
from ..engine.live import LiveJob, serve_live, stop_signals
from .app import build_app
from .frontend import Frontend
from .metrics import LOGGER, StatsLine
from .protocol import Served

FAULT_LINGER_S = 2.0  # how long a failed server keeps answering 503 with the cause before it exits
HTTP_DRAIN_S = 5.0  # how long finished responses get to reach their clients when the server stops

log = logging.getLogger(LOGGER)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Everything ``splash serve`` decided before anything starts."""

    host: str
    port: int
    served: Served
    info: dict  # what /server_info and /model_info report
    job: dict  # LiveJob's fields but the connection
    backend: str
    T: int
    collective_timeout_s: float
    api_key: str | None = None
    grace_s: float = 30.0
    log_level: str = "info"
    stats_interval_s: float = 10.0  # how often the stats line is logged while the server is busy
    max_body_bytes: int = 32 * 2**20  # a larger request body gets 413
    max_prompt_tokens: int | None = None  # a longer prompt gets 400 (None: the context length bounds it)
    allowed_origins: tuple[str, ...] = ()  # CORS: the origins browsers may call from ("*": any; none: CORS off)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) now, so a port in use fails before any rank starts (OSError)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def run_server(config: ServerConfig, sock: socket.socket) -> int:
    """Serve until stopped; the exit code (0 after a signal, 1 after a fault)."""
    import uvicorn

    front, back = mp.Pipe()
    frontend = Frontend(config.served, front, config.info)
    app = build_app(frontend, config.api_key, max_body_bytes=config.max_body_bytes,
                    max_prompt_tokens=config.max_prompt_tokens, allowed_origins=config.allowed_origins)
    # log_config None: uvicorn's loggers keep the handlers and format the CLI set up
    server = uvicorn.Server(uvicorn.Config(app, log_level=config.log_level, log_config=None, lifespan="on",
                                           timeout_graceful_shutdown=HTTP_DRAIN_S))
    http = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="splash-http")
    http.start()
    threading.Thread(target=_announce, args=(frontend, config), daemon=True, name="splash-announce").start()
    stopped = threading.Event()
    threading.Thread(target=_log_stats, args=(frontend, config.stats_interval_s, stopped), daemon=True,
                     name="splash-stats").start()
    stopper = _Stopper(frontend, config.grace_s)
    code = 0
    try:
        with stop_signals(stopper.handle):
            _run_group(config, LiveJob(conn=back, **config.job))
        if frontend.in_flight:  # the engine stopped with requests in flight (their link was lost)
            frontend.fail("the engine stopped before these requests finished")
    except _StopNow as stop:
        code = 128 + stop.signum
    except Exception as exc:  # a rank failed: RankError names it; under torchrun a failed collective
        cause = _cause(exc)
        log.error("%s", str(exc).rstrip())
        log.error("error: the group stopped: %s", cause)
        frontend.fail(cause)
        time.sleep(FAULT_LINGER_S)
        code = 1
    finally:
        stopped.set()
        stopper.cancel()
        _stop_http(server, http, frontend)
    if stopper.signals and code == 0:
        log.info("stopped")
    return code


def _run_group(config: ServerConfig, job: LiveJob) -> None:
    if under_torchrun():
        from ..runtime.group import from_env, shutdown

        ctx = from_env(config.backend, config.collective_timeout_s)
        try:
            serve_live(ctx, dataclasses.replace(job, front_end_here=True))
        finally:
            shutdown(ctx)
        return
    from ..runtime.spawn import RankPool

    with RankPool(config.T, backend=config.backend, timeout_s=config.collective_timeout_s) as pool:
        pool.run(serve_live, job, timeout_s=365 * 24 * 3600.0)  # a server runs until stopped


def _cause(exc: Exception) -> str:
    """One line on why the group stopped: a rank's error names the rank; where it carries a
    traceback, the exception and the engine's note after it say what failed."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    if not lines[0].endswith("Traceback (most recent call last):"):
        return lines[0]
    frames = [i for i, line in enumerate(lines) if line.startswith(" ")]
    tail = " ".join(line.strip() for line in lines[frames[-1] + 1:]) if frames else lines[-1]
    return f"{lines[0].split('Traceback')[0].strip()} {tail}".strip()


def _announce(frontend: Frontend, config: ServerConfig) -> None:
    frontend.engine_ready.wait()
    info, served = frontend.info, frontend.served
    log.info("ready on http://%s:%d serving %r (deployment %s, T = %s, %s, policy %s, layout %s, %s KV pages per "
             "layer and rank)", config.host, config.port, served.model, info["deployment"], info["T"],
             info["backend"], info["policy"], frontend.layout, f"{info['kv_pages']:,}")
    if info.get("graphs"):
        log.info("%s", info["graphs"])
    if info.get("chat_template"):
        log.info("chat template: %s", info["chat_template"])
    if served.defaults:
        log.info("sampling defaults (generation_config.json) for fields a request omits: %s",
                 ", ".join(f"{k} {v:g}" for k, v in served.defaults.items()))


def _log_stats(frontend: Frontend, interval_s: float, stopped: threading.Event) -> None:
    stats = StatsLine(frontend.metrics)
    while not stopped.wait(interval_s):
        line = stats.line()
        if line:
            log.info("%s", line)


def _stop_http(server, http: threading.Thread, frontend: Frontend) -> None:
    """Stop serving HTTP once the responses in flight are out (after a second signal they were
    aborted: their streams end at once, so uvicorn's graceful shutdown has nothing to wait for)."""
    deadline = time.monotonic() + HTTP_DRAIN_S
    while frontend.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    server.should_exit = True
    http.join(timeout=2 * HTTP_DRAIN_S)


class _StopNow(Exception):
    """A second stop signal: unwinds the group (the pool stops its ranks) at once."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


class _Stopper:
    """SIGTERM/SIGINT while serving: the first drains (grace period), a second stops at once."""

    def __init__(self, frontend: Frontend, grace_s: float):
        self.frontend, self.grace_s, self.signals = frontend, grace_s, 0
        self.timer: threading.Timer | None = None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def handle(self, signum, frame) -> None:
        self.signals += 1
        n = self.frontend.in_flight
        if self.signals > 2:
            return  # already stopping at once
        if self.signals == 2:
            self.frontend.abort_all()
            log.warning("stopping at once (a second signal): %d request%s in flight aborted", n, "" if n == 1 else "s")
            raise _StopNow(signum)  # unwinds the pool, which stops the ranks
        self.frontend.drain()  # first: once the line is out, new requests are refused
        log.info("stopping: no new requests; %d in flight get %g s to finish", n, self.grace_s)
        self.timer = threading.Timer(self.grace_s, self.frontend.abort_all)
        self.timer.daemon = True
        self.timer.start()
