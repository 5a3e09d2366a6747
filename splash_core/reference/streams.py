"""Host "streams": CPU work is synchronous, so a stream is a label and an event is a clock.

Collectives issued with ``async_op=True`` still run concurrently on gloo's own threads; the
switch executor overlaps through those handles, so its code path is the same as on GPUs.
"""

from __future__ import annotations

import contextlib
import time


class HostStream:
    """A named, always-idle stream."""

    def __init__(self, name: str = "main"):
        self.name = name

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        """Always drained: host work is done by the time the call returns."""
        return True

    def __repr__(self) -> str:
        return f"HostStream({self.name})"


class HostEvent:
    """Completed as soon as recorded; ``elapsed_time`` in ms between two records."""

    def __init__(self, timing: bool = False):
        self.timing = timing
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def wait(self, stream=None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return self.t is not None

    def elapsed_time(self, end: "HostEvent") -> float:
        if self.t is None or end.t is None:
            raise RuntimeError("both events must be recorded before elapsed_time")
        return (end.t - self.t) * 1e3


class HostStreamOps:
    """:class:`splash_core.platform.interfaces.StreamOps` for CPU."""

    def __init__(self):
        self._main = HostStream("main")
        self._count = 0

    def current_stream(self) -> HostStream:
        return self._main

    def new_stream(self) -> HostStream:
        self._count += 1
        return HostStream(f"side{self._count}")

    def use_stream(self, stream) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext(stream)

    def new_event(self, timing: bool = False) -> HostEvent:
        return HostEvent(timing)

    def synchronize(self) -> None:
        return None
