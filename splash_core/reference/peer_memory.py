"""Peer memory on the host: each rank's buffer is a file in shared memory (``/dev/shm`` where
there is one) that every rank of the group maps, so a pull is a plain copy out of a peer's
mapping. This is the executable spec of :class:`splash_core.platform.interfaces.PeerMemory`: the same
one-sided pulls an accelerator's copy engines make, with host copies, and the same barrier
over signal slots behind each buffer (``PeerBuffers.barrier``), waited for on the host.

A buffer's file is unlinked as soon as it is made: its rank keeps it open, the peers open it
through ``/proc/<pid>/fd/<fd>``, and the mappings keep the memory. So nothing is ever left in
``/dev/shm``, even by a rank that is killed. Where there is no ``/proc`` there is no host peer
memory (:func:`available`), and switches move pages by collectives.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import torch

from ..platform.interfaces import PeerMemoryError


def available() -> bool:
    return os.path.isdir(f"/proc/{os.getpid()}/fd")


def _shared_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


SIGNAL_ALIGN = 64  # the signal slots (one int64 per rank) start at the buffer's size rounded up to this


def signal_offset(nbytes: int) -> int:
    return -(-max(int(nbytes), 1) // SIGNAL_ALIGN) * SIGNAL_ALIGN


class HostPeerBuffers:
    """Every rank's buffer mapped here; :meth:`pull` copies on the calling thread.

    ``min_run_bytes``: a copy costs the host about 4 us of calls (tensor slicing and ``copy_``),
    so runs shorter than 64 KiB would be bound by the calls, not by memory; pages in shorter
    runs move by collectives.

    ``signals``: per rank, that rank's signal slots (int64 [T], mapped here; :meth:`barrier`)."""

    min_run_bytes = 64 << 10

    def __init__(self, mine: torch.Tensor, peers: list[torch.Tensor], rank: int = 0,
                 signals: list[torch.Tensor] | None = None):
        self.mine, self.peers, self.rank, self.signals = mine, peers, rank, signals or []

    def barrier(self, epoch: int, timeout_s: float) -> None:
        """Tell every rank this one reached ``epoch`` (its slot in each rank's signals), then wait
        on the host until every rank told this one; PeerMemoryError naming the late ranks after
        ``timeout_s``. Pulls before it are done (they copy on this thread)."""
        for peer in self.signals:
            peer[self.rank] = epoch
        mine, deadline = self.signals[self.rank], time.monotonic() + timeout_s
        while bool((mine < epoch).any()):
            if time.monotonic() > deadline:
                late = (mine < epoch).nonzero().flatten().tolist()
                raise PeerMemoryError(f"rank {self.rank}: timed out after {timeout_s:g} s: ranks {late} did not "
                                      f"reach peer barrier {epoch}")
            time.sleep(50e-6)  # ranks may share cores: spinning would starve the late one

    def pull(self, peer: int, runs) -> None:
        source = self.peers[peer]
        for src, dst, width, rows, src_pitch, dst_pitch in np.asarray(runs, dtype=np.int64).reshape(-1, 6).tolist():
            if rows == 1:
                self.mine[dst: dst + width].copy_(source[src: src + width])
            elif rows and width:
                _rows(self.mine, dst, rows, width, dst_pitch).copy_(_rows(source, src, rows, width, src_pitch))

    def close(self) -> None:
        self.peers = []


class HostPeerMemory:
    """:class:`~splash_core.platform.interfaces.PeerMemory` over files in shared memory, for CPU ranks."""

    def __init__(self, collectives):
        self.collectives = collectives
        self._files: dict[int, tuple[int, torch.Tensor]] = {}  # buffer's data pointer -> its file's descriptor, whole map

    def _file_bytes(self, nbytes: int) -> int:
        """The buffer, then its signal slots (one int64 per rank)."""
        return signal_offset(nbytes) + 8 * self.collectives.size

    def allocate(self, nbytes: int) -> torch.Tensor:
        fd, path = tempfile.mkstemp(prefix="splash-peer-", dir=_shared_dir())
        os.unlink(path)  # the descriptor keeps the file
        try:
            # Reserve the room now: a full tmpfs then fails here, not with SIGBUS at a later write.
            os.posix_fallocate(fd, 0, self._file_bytes(nbytes))
            whole = torch.from_file(_path(os.getpid(), fd), shared=True, size=self._file_bytes(nbytes),
                                    dtype=torch.uint8)
            buffer = whole[:nbytes]
        except (OSError, RuntimeError) as exc:
            os.close(fd)
            raise PeerMemoryError(f"rank {self.collectives.rank}: cannot reserve {nbytes} bytes of shared memory "
                                  f"in {os.path.dirname(path)}: {exc}") from exc
        self._files[buffer.data_ptr()] = (fd, whole)
        return buffer

    def share(self, buffer: torch.Tensor) -> HostPeerBuffers:
        fd, whole = self._files.pop(buffer.data_ptr(), (None, None))
        shared = self.collectives.all_gather_object((os.getpid(), fd, buffer.numel()))
        missing = [r for r, (_, f, _) in enumerate(shared) if f is None]
        sizes = {n for _, _, n in shared}
        if missing or len(sizes) != 1:
            if fd is not None:
                self._files[buffer.data_ptr()] = (fd, whole)
            raise PeerMemoryError(f"peer memory: ranks {missing} passed a buffer this memory did not allocate"
                                  if missing else f"peer memory: the ranks' buffers differ in size ({sorted(sizes)})")
        try:
            wholes = [whole if r == self.collectives.rank else
                      torch.from_file(_path(pid, f), shared=True, size=self._file_bytes(n), dtype=torch.uint8)
                      for r, (pid, f, n) in enumerate(shared)]
        finally:
            self.collectives.barrier()  # every rank has mapped every file (or failed trying)
            os.close(fd)
        n, at = buffer.numel(), signal_offset(buffer.numel())
        return HostPeerBuffers(buffer, [w[:n] for w in wholes], self.collectives.rank,
                               [w[at: at + 8 * len(wholes)].view(torch.int64) for w in wholes])


def _rows(buffer: torch.Tensor, first: int, rows: int, width: int, pitch: int) -> torch.Tensor:
    """[rows, width] view of ``buffer`` (1-D bytes) starting at byte ``first``, rows ``pitch`` apart."""
    return buffer.as_strided((rows, width), (pitch, 1), buffer.storage_offset() + first)


def _path(pid: int, fd: int) -> str:
    return f"/proc/{pid}/fd/{fd}"
