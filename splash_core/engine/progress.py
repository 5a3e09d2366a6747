"""A progress bar on stderr for long runs (rank 0 only; silent when disabled, e.g. under --json)."""

from __future__ import annotations

import sys
import time


class Progress:
    """Requests done, tokens generated, step, layout: redrawn in place on a terminal at most every
    ``interval_s``, else (a log file) one line every ``log_interval_s``."""

    def __init__(self, total_requests: int, enabled: bool = True, width: int = 24, interval_s: float = 0.1,
                 log_interval_s: float = 5.0, stream=None):
        self.total, self.enabled, self.width = max(1, total_requests), enabled, width
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval = interval_s if self.tty else log_interval_s
        self._last = -float("inf")
        self._drawn = False

    def update(self, *, done: int, generated: int, step: int, layout, switches: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.interval):
            return
        self._last = now
        filled = int(self.width * done / self.total)
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} requests  {generated:,} tokens  "
                f"step {step}  {layout}  {switches} switch{'es' if switches != 1 else ''}")
        self.stream.write(f"\r{line}   " if self.tty else f"{line}\n")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn and self.tty:
            self.stream.write("\n")
            self.stream.flush()
