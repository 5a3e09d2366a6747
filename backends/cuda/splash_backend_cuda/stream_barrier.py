"""A barrier of the group in stream order that holds no processor (``PeerBuffers.barrier``):
each rank writes its epoch into a signal slot behind every rank's shared buffer with
``cuStreamWriteValue32`` (fenced behind the stream's earlier work: pulls, writes), then the
stream waits on its own slots with ``cuStreamWaitValue32``. Both are stream memory operations,
run by the GPU's front end, so nothing occupies a processor while a peer is late. A collective's
kernel would spin on processors instead, and on an H200 a one-thread kernel spinning beside a
step's kernels slowed the step by 0.88-0.97 of its own time
(bench/results/h200/copy_interference.json, ``spin``).

A waiting stream cannot be interrupted. A watchdog thread watches every barrier's completion;
one that outlasts its timeout ends the process with a message naming the rank and the epoch, as
NCCL's watchdog does for a hung collective (the alternative, releasing the stream, would let the
switch land pages a dead peer never finished)."""

from __future__ import annotations

import collections
import ctypes
import os
import sys
import threading
import time

import torch

_WAIT_GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ
_WRITE_FENCED = 0  # CU_STREAM_WRITE_VALUE_DEFAULT: a memory fence before the write


def bind(lib) -> bool:
    """Declare the stream memory operations on the driver library ``lib``; False where it has none."""
    try:
        for name in ("cuStreamWriteValue32_v2", "cuStreamWaitValue32_v2"):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int
    except AttributeError:
        return False
    return True


SLOT_BYTES = 4


class StreamBarrier:
    """The barrier over slots at byte ``at`` of every rank's buffer (``bases``, this rank's at
    ``bases[rank]``), one uint32 per rank, zero to start."""

    def __init__(self, driver, device: torch.device, bases: list[int], rank: int, at: int):
        self.driver, self.device, self.bases, self.rank, self.at = driver, device, bases, rank, at

    def __call__(self, epoch: int, timeout_s: float) -> None:
        driver, lib = self.driver, self.driver.lib
        stream = torch.cuda.current_stream(self.device)
        handle, value = ctypes.c_void_p(stream.cuda_stream), int(epoch) & 0xFFFFFFFF
        for r, base in enumerate(self.bases):
            driver.check(lib.cuStreamWriteValue32_v2(handle, base + self.at + SLOT_BYTES * self.rank, value,
                                                     _WRITE_FENCED), f"signalling rank {r}")
        mine = self.bases[self.rank] + self.at
        for r in range(len(self.bases)):
            driver.check(lib.cuStreamWaitValue32_v2(handle, mine + SLOT_BYTES * r, value, _WAIT_GEQ),
                         f"waiting for rank {r}")
        done = torch.cuda.Event()
        done.record(stream)
        _watchdog().watch(done, timeout_s, f"rank {self.rank}: timed out after {timeout_s:g} s: a peer did not "
                                           f"reach peer barrier {epoch}")


class _Watchdog(threading.Thread):
    """Ends the process when a watched barrier has not completed by its deadline."""

    POLL_S = 0.05

    def __init__(self):
        super().__init__(name="splash-peer-barrier-watchdog", daemon=True)
        self._pending: collections.deque = collections.deque()
        self._lock = threading.Lock()

    def watch(self, event, timeout_s: float, message: str) -> None:
        with self._lock:
            self._pending.append((event, time.monotonic() + timeout_s, message))

    def run(self) -> None:
        while True:
            time.sleep(self.POLL_S)
            with self._lock:
                while self._pending and self._pending[0][0].query():  # a stream's barriers complete in order
                    self._pending.popleft()
                now = time.monotonic()
                late = [m for event, deadline, m in self._pending if deadline < now and not event.query()]
            if late:
                sys.stderr.write(f"SPLASH: {late[0]}; ending the process (a waiting stream cannot be "
                                 "interrupted)\n")
                sys.stderr.flush()
                os.abort()


_WATCHDOG: _Watchdog | None = None


def _watchdog() -> _Watchdog:
    global _WATCHDOG
    if _WATCHDOG is None:
        _WATCHDOG = _Watchdog()
        _WATCHDOG.start()
    return _WATCHDOG
