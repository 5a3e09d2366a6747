"""Spawn T ranks on this host and run functions on all of them.

:class:`RankPool` keeps its processes (and their process group) alive between calls, so
tests and benchmarks pay the start-up once. Each call runs ``fn(ctx, *args)`` on every rank,
where ``fn`` is a module-level function and ``ctx`` the rank's
:class:`~splash_core.runtime.group.RankContext`. A rank that raises, dies or exceeds the
timeout turns into :class:`RankError` naming the rank; a pool that lost a rank is closed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import traceback
from typing import Any, Callable

_POLL_S = 0.05
_DEATH_GRACE_S = 0.2  # how long a failing rank's peers get to be seen dead


class RankError(RuntimeError):
    """A rank failed: ``rank`` is the first that failed, the message carries its traceback."""

    def __init__(self, rank: int, message: str):
        self.rank = rank
        super().__init__(f"rank {rank}: {message}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, backend, timeout_s, env, conn):
    os.environ.update(env)
    try:
        import torch

        torch.set_num_threads(1)  # T ranks share the host's cores
        from .group import init_rank

        ctx = init_rank(rank, world_size, backend=backend, init_method=f"tcp://127.0.0.1:{port}",
                        timeout_s=timeout_s)
        conn.send(("ready", None))
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            break
        fn, args, kwargs = msg
        try:
            conn.send(("ok", fn(ctx, *args, **kwargs)))
        except BaseException:
            conn.send(("err", traceback.format_exc()))
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
            proc = ctx.Process(target=_worker, args=(rank, world_size, port, backend, timeout_s, env, child),
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
        for conn, proc in zip(self._conns, self._procs):
            if not force and proc.is_alive():
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
        for proc in self._procs:
            proc.join(timeout=0 if force else 10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self._procs, self._conns = [], []

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spawn(fn: Callable, world_size: int, *args: Any, backend: str = "reference",
          timeout_s: float = 300.0, **kwargs: Any) -> list:
    """Start ``world_size`` ranks, run ``fn(ctx, *args)`` once, shut them down."""
    with RankPool(world_size, backend=backend, timeout_s=timeout_s) as pool:
        return pool.run(fn, *args, **kwargs)
