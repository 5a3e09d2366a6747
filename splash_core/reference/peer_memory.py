"""Peer memory on the host: each rank's buffer is a file in shared memory (``/dev/shm`` where
there is one) that every rank of the group maps, so a pull is a plain copy out of a peer's
mapping. This is the executable spec of :class:`splash_core.interfaces.PeerMemory`: the same
one-sided pulls an accelerator's copy engines make, with host copies.

A buffer's file is unlinked as soon as it is made: its rank keeps it open, the peers open it
through ``/proc/<pid>/fd/<fd>``, and the mappings keep the memory. So nothing is ever left in
``/dev/shm``, even by a rank that is killed. Where there is no ``/proc`` there is no host peer
memory (:func:`available`), and switches move pages by collectives.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import torch

from ..interfaces import PeerMemoryError


def available() -> bool:
    return os.path.isdir(f"/proc/{os.getpid()}/fd")


def _shared_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class HostPeerBuffers:
    """Every rank's buffer mapped here; :meth:`pull` copies on the calling thread.

    ``min_run_bytes``: a copy costs the host about 4 us of calls (tensor slicing and ``copy_``),
    so runs shorter than 64 KiB would be bound by the calls, not by memory; pages in shorter
    runs move by collectives."""

    min_run_bytes = 64 << 10

    def __init__(self, mine: torch.Tensor, peers: list[torch.Tensor]):
        self.mine, self.peers = mine, peers

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
    """:class:`~splash_core.interfaces.PeerMemory` over files in shared memory, for CPU ranks."""

    def __init__(self, collectives):
        self.collectives = collectives
        self._files: dict[int, int] = {}  # buffer's data pointer -> the open descriptor of its file

    def allocate(self, nbytes: int) -> torch.Tensor:
        fd, path = tempfile.mkstemp(prefix="splash-peer-", dir=_shared_dir())
        os.unlink(path)  # the descriptor keeps the file
        try:
            # Reserve the room now: a full tmpfs then fails here, not with SIGBUS at a later write.
            os.posix_fallocate(fd, 0, max(int(nbytes), 1))
            buffer = torch.from_file(_path(os.getpid(), fd), shared=True, size=max(int(nbytes), 1),
                                     dtype=torch.uint8)[:nbytes]
        except (OSError, RuntimeError) as exc:
            os.close(fd)
            raise PeerMemoryError(f"rank {self.collectives.rank}: cannot reserve {nbytes} bytes of shared memory "
                                  f"in {os.path.dirname(path)}: {exc}") from exc
        self._files[buffer.data_ptr()] = fd
        return buffer

    def share(self, buffer: torch.Tensor) -> HostPeerBuffers:
        fd = self._files.pop(buffer.data_ptr(), None)
        shared = self.collectives.all_gather_object((os.getpid(), fd, buffer.numel()))
        missing = [r for r, (_, f, _) in enumerate(shared) if f is None]
        sizes = {n for _, _, n in shared}
        if missing or len(sizes) != 1:
            if fd is not None:
                self._files[buffer.data_ptr()] = fd
            raise PeerMemoryError(f"peer memory: ranks {missing} passed a buffer this memory did not allocate"
                                  if missing else f"peer memory: the ranks' buffers differ in size ({sorted(sizes)})")
        try:
            peers = [buffer if r == self.collectives.rank else
                     torch.from_file(_path(pid, f), shared=True, size=max(n, 1), dtype=torch.uint8)[:n]
                     for r, (pid, f, n) in enumerate(shared)]
        finally:
            self.collectives.barrier()  # every rank has mapped every file (or failed trying)
            os.close(fd)
        return HostPeerBuffers(buffer, peers)


def _rows(buffer: torch.Tensor, first: int, rows: int, width: int, pitch: int) -> torch.Tensor:
    """[rows, width] view of ``buffer`` (1-D bytes) starting at byte ``first``, rows ``pitch`` apart."""
    return buffer.as_strided((rows, width), (pitch, 1), buffer.storage_offset() + first)


def _path(pid: int, fd: int) -> str:
    return f"/proc/{pid}/fd/{fd}"
