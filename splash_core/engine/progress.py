"""The progress bar of a run (tqdm, on rank 0's stderr; off under --json).

It counts generated tokens against the workload's total, so it moves with every decode step
even when every request finishes at the end (a sweep), and shows the step, the current
layout, requests finished, switches, the rate and the elapsed time. On a terminal it redraws
at most every ``interval_s``; in a log file every ``log_interval_s``.
"""

from __future__ import annotations

import sys
import threading

from tqdm import tqdm

_FORMAT = "{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} tokens [{elapsed}, {rate_fmt}{postfix}]"


class Progress:
    def __init__(self, total_tokens: int, total_requests: int, enabled: bool = True, interval_s: float = 0.1,
                 log_interval_s: float = 5.0, stream=None):
        stream = stream or sys.stderr
        self.requests = total_requests
        # a thread lock, not tqdm's default multiprocessing one: a rank that is terminated would
        # leak that semaphore (and the resource tracker would warn about it at exit)
        tqdm.set_lock(threading.RLock())
        self.bar = tqdm(total=max(1, total_tokens), desc="splash run", unit=" tokens", bar_format=_FORMAT,
                        file=stream, disable=not enabled, dynamic_ncols=True, leave=True,
                        mininterval=interval_s if stream.isatty() else log_interval_s)

    def update(self, *, done: int, generated: int, step: int, layout, switches: int) -> None:
        if self.bar.disable:
            return
        self.bar.set_postfix_str(f"step {step}, {layout}, {done}/{self.requests} requests done, "
                                 f"{switches} switch{'es' if switches != 1 else ''}", refresh=False)
        self.bar.update(generated - self.bar.n)  # tqdm redraws when its interval has passed

    def close(self) -> None:
        """Draw the final state and end the line."""
        self.bar.close()
