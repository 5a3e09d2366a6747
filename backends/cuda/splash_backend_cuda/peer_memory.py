"""Peer memory over CUDA IPC (``splash_peer_memory``): a rank's KV pool is one ``cuMemAlloc``
allocation, whose IPC handle the group exchanges over host collectives; every rank opens its
peers' handles in its own context (peer access enabled lazily, as NCCL's P2P transport does),
and a pull is one ``cuMemcpyDtoDAsync`` per run of pages on the current stream (one
``cuMemcpy2DAsync`` per run of every T-th page). Behind each buffer lie the slots of the
group's barrier (:mod:`.stream_barrier`), so pulls are fenced without any collective. A copy between
two GPUs' memories is carried by a copy engine, so a switch's page traffic takes none of the
processors the step computes on.

The driver API is called through ctypes (``libcuda.so.1``, which every CUDA driver installs), so
the backend needs no package beyond torch. The buffer is wrapped as a torch tensor through
``__cuda_array_interface__`` and freed with it; it lives outside torch's caching allocator, whose
blocks (and expandable segments) IPC cannot export whole.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from splash_core.platform.interfaces import PeerMemoryError

from . import stream_barrier

_LAZY_ENABLE_PEER_ACCESS = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


class _IpcHandle(ctypes.Structure):
    # CUipcMemHandle. Bytes, not c_char: a c_char array reads as a string, cut at its first NUL.
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


class _Memcpy2D(ctypes.Structure):
    # CUDA_MEMCPY2D (cuda.h): source then destination, each (x, y, memory type, host, device,
    # array, pitch), then the copy's width in bytes and height in rows.
    _fields_ = [(f"{side}{name}", kind) for side in ("src", "dst") for name, kind in (
        ("XInBytes", ctypes.c_size_t), ("Y", ctypes.c_size_t), ("MemoryType", ctypes.c_int),
        ("Host", ctypes.c_void_p), ("Device", ctypes.c_uint64), ("Array", ctypes.c_void_p),
        ("Pitch", ctypes.c_size_t))] + [("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t)]


_MEMORYTYPE_DEVICE = 2  # CU_MEMORYTYPE_DEVICE
_MAX_PITCH = 11  # CU_DEVICE_ATTRIBUTE_MAX_PITCH


class _Driver:
    """The few driver calls peer memory makes, each checked."""

    def __init__(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise PeerMemoryError(f"CUDA driver library not loadable: {exc}") from exc
        ptr, size = ctypes.c_uint64, ctypes.c_size_t
        self._sig(lib, "cuMemAlloc_v2", [ctypes.POINTER(ptr), size])
        self._sig(lib, "cuMemFree_v2", [ptr])
        self._sig(lib, "cuMemsetD8_v2", [ptr, ctypes.c_ubyte, size])
        self._sig(lib, "cuIpcGetMemHandle", [ctypes.POINTER(_IpcHandle), ptr])
        self._sig(lib, "cuIpcOpenMemHandle_v2", [ctypes.POINTER(ptr), _IpcHandle, ctypes.c_uint])
        self._sig(lib, "cuIpcCloseMemHandle", [ptr])
        self._sig(lib, "cuMemcpyDtoDAsync_v2", [ptr, ptr, size, ctypes.c_void_p])
        self._sig(lib, "cuMemcpy2DAsync_v2", [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p])
        self._sig(lib, "cuDeviceGet", [ctypes.POINTER(ctypes.c_int), ctypes.c_int])
        self._sig(lib, "cuDeviceGetAttribute", [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int])
        self._sig(lib, "cuGetErrorString", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])
        self.lib, self.stream_memops = lib, stream_barrier.bind(lib)

    @staticmethod
    def _sig(lib, name, argtypes) -> None:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def check(self, result: int, what: str) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(result, ctypes.byref(text))
            raise PeerMemoryError(f"{what}: CUDA error {result} ({(text.value or b'?').decode()})")


_DRIVER: _Driver | None = None


def _driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver()
    return _DRIVER


class _Allocation:
    """Device memory of ``cuMemAlloc``, seen by torch through the CUDA array interface and freed
    when the last tensor on it goes."""

    def __init__(self, nbytes: int, device: torch.device, tail: int = 0):
        """``nbytes`` seen by torch, then ``tail`` more (the barrier's slots) from
        :func:`signal_offset`; all zeroed."""
        driver, total = _driver(), signal_offset(nbytes) + tail
        torch.zeros(1, device=device)  # the device's primary context, current on this thread
        ptr = ctypes.c_uint64()
        driver.check(driver.lib.cuMemAlloc_v2(ctypes.byref(ptr), total), f"cuMemAlloc of {total} bytes")
        self.ptr, self.nbytes, self._driver = ptr.value, nbytes, driver
        driver.check(driver.lib.cuMemsetD8_v2(self.ptr, 0, total), "cuMemsetD8")
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                                         "version": 3, "strides": None}

    def __del__(self):
        if getattr(self, "ptr", None):
            self._driver.lib.cuMemFree_v2(self.ptr)


def signal_offset(nbytes: int) -> int:
    """Where the barrier's slots start behind a buffer of ``nbytes``."""
    return -(-max(int(nbytes), 1) // 256) * 256


class CudaPeerBuffers:
    """The group's buffers as this rank sees them: its own and every peer's, opened through IPC.

    ``min_run_bytes``: each copy costs the host 7-10 us (ctypes and the driver), so on an H200
    576 MiB of pages took 60-87 ms in 72 KiB copies, 3.6-5.6 ms in 1.1 MiB ones, 0.9-1.4 ms in
    4.5 MiB ones and 0.40 ms in 18 MiB ones (bench/results/h200/copy_interference.json and
    copy_interference-a573e0b.json at git 148a7b0, ``run_lengths``; pitched copies of 72 KiB rows took about as
    long up to 4.5 MiB, and 0.83 ms in 18 MiB); in shorter runs than 4 MiB, a layer's pages move
    faster by the collective path."""

    min_run_bytes = 4 << 20

    def __init__(self, device: torch.device, mine: int, peers: list[int], keep, rank: int = 0):
        self.device, self.mine, self.peers, self._keep, self.rank = device, mine, peers, keep, rank
        self._max_pitch = _max_pitch(self.device)
        # the group's barrier (PeerBuffers.barrier) where the driver has stream memory operations
        self.barrier = (stream_barrier.StreamBarrier(_driver(), device, peers, rank, signal_offset(keep.nbytes))
                        if _driver().stream_memops else None)
        self._copy2d = _Memcpy2D(srcMemoryType=_MEMORYTYPE_DEVICE, dstMemoryType=_MEMORYTYPE_DEVICE)

    def pull(self, peer: int, runs) -> None:
        """One ``cuMemcpyDtoDAsync`` per one-row copy, one ``cuMemcpy2DAsync`` per pitched one (row
        by row where a pitch exceeds the device's largest)."""
        driver, base = _driver(), self.peers[peer]
        stream = ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
        for src, dst, width, rows, src_pitch, dst_pitch in np.asarray(runs, dtype=np.int64).reshape(-1, 6).tolist():
            if not width or not rows:
                continue
            if rows == 1 or max(src_pitch, dst_pitch) > self._max_pitch:
                for j in range(rows):
                    driver.check(driver.lib.cuMemcpyDtoDAsync_v2(self.mine + dst + j * dst_pitch,
                                                                 base + src + j * src_pitch, width, stream),
                                 f"copy of {width} bytes from rank {peer}")
                continue
            c = self._copy2d
            c.srcDevice, c.srcPitch, c.dstDevice, c.dstPitch = base + src, src_pitch, self.mine + dst, dst_pitch
            c.WidthInBytes, c.Height = width, rows
            driver.check(driver.lib.cuMemcpy2DAsync_v2(ctypes.byref(c), stream),
                         f"pitched copy of {rows} x {width} bytes from rank {peer}")

    def close(self) -> None:
        driver = _driver()
        for ptr in self.peers:
            if ptr != self.mine:
                driver.lib.cuIpcCloseMemHandle(ptr)
        self.peers = []

    def __del__(self):
        if self.peers:
            self.close()


def _max_pitch(device: torch.device) -> int:
    driver, handle, value = _driver(), ctypes.c_int(), ctypes.c_int()
    index = device.index if device.index is not None else torch.cuda.current_device()
    driver.check(driver.lib.cuDeviceGet(ctypes.byref(handle), index), "cuDeviceGet")
    driver.check(driver.lib.cuDeviceGetAttribute(ctypes.byref(value), _MAX_PITCH, handle), "max pitch")
    return int(value.value)


class CudaPeerMemory:
    """:class:`splash_core.platform.interfaces.PeerMemory` over CUDA IPC (see the module docstring)."""

    def __init__(self, collectives, device):
        self.collectives, self.device = collectives, torch.device(device)
        self._allocations: dict[int, _Allocation] = {}

    def allocate(self, nbytes: int) -> torch.Tensor:
        allocation = _Allocation(int(nbytes), self.device, stream_barrier.SLOT_BYTES * self.collectives.size)
        tensor = torch.as_tensor(allocation, device=self.device)
        self._allocations[tensor.data_ptr()] = allocation
        return tensor

    def share(self, buffer: torch.Tensor) -> CudaPeerBuffers:
        rank = self.collectives.rank
        allocation = self._allocations.get(buffer.data_ptr())
        handle, error = None, None
        if allocation is None:
            error = "its buffer was not allocated by this peer memory"
        else:
            raw = _IpcHandle()
            try:
                _driver().check(_driver().lib.cuIpcGetMemHandle(ctypes.byref(raw), allocation.ptr), "cuIpcGetMemHandle")
                handle = ctypes.string_at(ctypes.addressof(raw), ctypes.sizeof(raw))
            except PeerMemoryError as exc:
                error = str(exc)
        shared = self.collectives.all_gather_object((handle, buffer.numel(), error))
        failed = [f"rank {r}: {e}" for r, (_, _, e) in enumerate(shared) if e]
        sizes = {n for _, n, _ in shared}
        if failed or len(sizes) != 1:
            raise PeerMemoryError("; ".join(failed) or f"the ranks' buffers differ in size ({sorted(sizes)})")
        driver, peers = _driver(), CudaPeerBuffers(self.device, allocation.ptr, [], allocation, rank)
        try:
            for r, (peer_handle, _, _) in enumerate(shared):
                if r == rank:
                    peers.peers.append(allocation.ptr)
                    continue
                ptr, raw = ctypes.c_uint64(), _IpcHandle.from_buffer_copy(peer_handle)
                driver.check(driver.lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), raw, _LAZY_ENABLE_PEER_ACCESS),
                             f"opening rank {r}'s buffer")
                peers.peers.append(ptr.value)
        except PeerMemoryError:
            peers.close()  # what this rank opened so far
            raise
        return peers
