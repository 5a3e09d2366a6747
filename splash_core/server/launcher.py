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
second signal stops at once (exit 130). A rank that crashes or hangs (collectives time out
after ``collective_timeout_s``): every request in flight ends with the cause, new ones get 503
with it for :data:`FAULT_LINGER_S` seconds (so clients and health probes learn why), then the
server exits 1. The ranks never outlive the server: the pool stops them, and a rank whose parent
is gone exits by itself.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import socket
import sys
import threading
import time

from ..engine.launch import under_torchrun
from ..engine.live import LiveJob, serve_live, stop_signals
from .app import build_app
from .frontend import Frontend
from .protocol import Served

FAULT_LINGER_S = 2.0  # how long a failed server keeps answering 503 with the cause before it exits
HTTP_DRAIN_S = 5.0  # how long finished responses get to reach their clients when the server stops


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
    server = uvicorn.Server(uvicorn.Config(build_app(frontend, config.api_key), log_level=config.log_level,
                                           lifespan="on", timeout_graceful_shutdown=HTTP_DRAIN_S))
    http = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="splash-http")
    http.start()
    threading.Thread(target=_announce, args=(frontend, config), daemon=True, name="splash-announce").start()
    stopper = _Stopper(frontend, config.grace_s)
    code = 0
    try:
        with stop_signals(stopper.handle):
            _run_group(config, LiveJob(conn=back, **config.job))
        if frontend.in_flight:  # the engine stopped with requests in flight (their link was lost)
            frontend.fail("the engine stopped before these requests finished")
    except Exception as exc:  # a rank failed: RankError names it; under torchrun a failed collective
        cause = _cause(exc)
        print(str(exc), file=sys.stderr)
        print(f"splash serve: error: the group stopped: {cause}", file=sys.stderr)
        frontend.fail(cause)
        time.sleep(FAULT_LINGER_S)
        code = 1
    finally:
        stopper.cancel()
        _stop_http(server, http, frontend)
    if stopper.signals and code == 0:
        print("splash serve: stopped", file=sys.stderr)
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
    info = frontend.info
    print(f"splash serve: ready on http://{config.host}:{config.port} serving {frontend.served.model!r} "
          f"(deployment {info['deployment']}, T = {info['T']}, {info['backend']}, policy {info['policy']}, "
          f"layout {frontend.layout}, {info['kv_pages']:,} KV pages per layer and rank)", file=sys.stderr, flush=True)
    if info.get("graphs"):
        print(f"splash serve: {info['graphs']}", file=sys.stderr, flush=True)


def _stop_http(server, http: threading.Thread, frontend: Frontend) -> None:
    deadline = time.monotonic() + HTTP_DRAIN_S
    while frontend.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    server.should_exit = True
    http.join(timeout=2 * HTTP_DRAIN_S)


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
        if self.signals > 1:
            raise KeyboardInterrupt  # unwinds the pool, which terminates the ranks
        n = self.frontend.in_flight
        self.frontend.drain()  # first: once the line is out, new requests are refused
        print(f"splash serve: stopping: no new requests; {n} in flight get {self.grace_s:g} s to finish",
              file=sys.stderr, flush=True)
        self.timer = threading.Timer(self.grace_s, self.frontend.abort_all)
        self.timer.daemon = True
        self.timer.start()
