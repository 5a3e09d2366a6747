"""Spawn T ranks on this host and run functions on all of them.

:class:`RankPool` keeps its processes (and their process group) alive between calls, so
tests and benchmarks pay the start-up once. Each call runs ``fn(ctx, *args)`` on every rank,
where ``fn`` is a module-level function and ``ctx`` the rank's
:class:`~splash_core.runtime.group.RankContext`. A rank that raises, dies or exceeds the
timeout turns into :class:`RankError` naming the rank; a pool that lost a rank is closed.

The parent owns the ranks' lifetime: ranks ignore SIGINT (Ctrl-C reaches the whole terminal's
process group; the parent decides), a pool left by an exception (Ctrl-C, SIGTERM turned into one
by ``splash``) terminates its ranks at once, and a rank whose parent is gone (killed outright)
exits by itself within a second, without printing anything.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import threading
import time
import traceback
from typing import Any, Callable

_POLL_S = 0.05
_DEATH_GRACE_S = 0.2  # how long a failing rank's peers get to be seen dead
_PARENT_POLL_S = 0.5  # how often a rank checks that its parent is still there
_TERMINATE_GRACE_S = 2.0  # how long terminated ranks get to exit before they are killed


class RankError(RuntimeError):
    """A rank failed: ``rank`` is the first that failed, the message carries its traceback."""

    def __init__(self, rank: int, message: str):
        self.rank = rank
        super().__init__(f"rank {rank}: {message}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)  # orphaned: nobody is left to report to


def _reply(conn, message) -> None:
    try:
        conn.send(message)
    except (BrokenPipeError, ConnectionError, EOFError, OSError):
        os._exit(1)  # the parent closed the pool while this rank worked: leave quietly


def _worker(rank, world_size, port, backend, timeout_s, env, conn, parent):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True, name="splash-parent-watch").start()
    os.environ.update(env)
    try:
        import torch

        torch.set_num_threads(1)  # T ranks share the host's cores
        from .group import init_rank

        ctx = init_rank(rank, world_size, backend=backend, init_method=f"tcp://127.0.0.1:{port}",
                        timeout_s=timeout_s)
        _reply(conn, ("ready", None))
    except BaseException:
        _reply(conn, ("err", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            break
        fn, args, kwargs = msg
        try:
            result = ("ok", fn(ctx, *args, **kwargs))
        except BaseException:
            result = ("err", traceback.format_exc())
        _reply(conn, result)
    from .group import shutdown

    shutdown(ctx)


class RankPool:
    """``world_size`` ranks of ``backend`` on this host, kept alive until :meth:`close`."""

    def __init__(self, world_size: int, backend: str = "reference", timeout_s: float = 120.0,
                 env: dict[str, str] | None = None):
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        port = free_port()
        self._conns, self._procs = [], []
        env = dict(env or {})
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, world_size, port, backend, timeout_s, env, child,
                                                     os.getpid()),
                               daemon=True, name=f"splash-rank{rank}")
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._collect("start", timeout_s)

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def run(self, fn: Callable, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> list:
        """``fn(ctx, *args, **kwargs)`` on every rank; the results in rank order."""
        if not self.alive:
            raise RankError(-1, "the pool is closed (a rank failed earlier)")
        for conn in self._conns:
            conn.send((fn, args, kwargs))
        return self._collect(getattr(fn, "__name__", str(fn)), timeout_s or self.timeout_s)

    def _collect(self, what: str, timeout_s: float) -> list:
        results: list = [None] * self.world_size
        pending = set(range(self.world_size))
        deadline = time.monotonic() + timeout_s
        while pending:
            for rank in sorted(pending):
                conn, proc = self._conns[rank], self._procs[rank]
                if conn.poll():
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        status, value = "err", f"died during {what} (exit code {proc.exitcode})"
                    if status == "err":
                        dead = self._dead_peer(rank)
                        self.close(force=True)
                        if dead is not None:  # a peer's death made this rank's collective fail
                            raise RankError(dead, f"died during {what} with exit code {self._exitcodes[dead]}; "
                                                  f"rank {rank} then failed:\n{value}")
                        raise RankError(rank, value)
                    results[rank] = value
                    pending.discard(rank)
                elif not proc.is_alive():
                    self.close(force=True)
                    raise RankError(rank, f"died during {what} with exit code {proc.exitcode}")
            if pending and time.monotonic() > deadline:
                self.close(force=True)
                raise RankError(min(pending), f"{what} did not finish within {timeout_s:.0f} s")
            if pending:
                time.sleep(_POLL_S)
        return results

    def _dead_peer(self, rank: int) -> int | None:
        """The lowest other rank whose process has exited, if any, after a short grace (a rank
        that exits mid-collective makes its peers' collectives fail; that rank is the cause)."""
        for attempt in range(2):
            dead = [r for r, p in enumerate(self._procs) if r != rank and not p.is_alive()]
            if dead:
                self._exitcodes = {r: self._procs[r].exitcode for r in dead}
                return dead[0]
            if attempt == 0:
                time.sleep(_DEATH_GRACE_S)
        return None

    def close(self, force: bool = False) -> None:
        """Shut the ranks down: ask idle ones to leave (``force``: terminate them, e.g. while they
        work); any rank still there after the grace is killed."""
        for conn, proc in zip(self._conns, self._procs):
            if not proc.is_alive():
                continue
            if force:
                proc.terminate()
                continue
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + (_TERMINATE_GRACE_S if force else 10.0)
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(force=exc_type is not None)  # interrupted or failed: the ranks may be mid-call


def spawn(fn: Callable, world_size: int, *args: Any, backend: str = "reference",
          timeout_s: float = 300.0, **kwargs: Any) -> list:
    """Start ``world_size`` ranks, run ``fn(ctx, *args)`` once, shut them down."""
    with RankPool(world_size, backend=backend, timeout_s=timeout_s) as pool:
        return pool.run(fn, *args, **kwargs)
