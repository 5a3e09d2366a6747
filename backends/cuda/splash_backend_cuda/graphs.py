"""CUDA graphs as :class:`splash_core.platform.interfaces.GraphOps`: a decode step captured once per
(layout, batch bucket) and replayed with one launch.

Warm-up runs on a side stream (as torch's ``make_graphed_callables`` does), so lazy
initialisation (cuBLAS workspaces, Triton's compilation, NCCL's first use) happens outside the
capture. Every graph of one model shares one memory pool: graphs replay one at a time, and
each keeps its outputs alive, so one graph's intermediates may reuse another's. A capture's
memory is the pool's growth while it ran (``torch.cuda.memory_reserved`` before and after the
recorded call), its time the host's, warm-up included.

NCCL collectives can be captured (torch's NCCL process groups record them into the graph);
gloo's cannot, which is why the CPU path runs the same static-buffer step eagerly instead.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch


@dataclasses.dataclass
class CudaGraph:
    """One captured graph and what its function returned at capture."""

    graph: torch.cuda.CUDAGraph
    outputs: Any
    capture_s: float
    nbytes: int

    def replay(self) -> None:
        self.graph.replay()


class CudaGraphOps:
    """:class:`~splash_core.platform.interfaces.GraphOps` on one CUDA device."""

    def __init__(self, device):
        self.device = torch.device(device)

    def new_pool(self) -> Any:
        """A memory pool the graphs share that stays alive while the caller holds it: a bare
        ``graph_pool_handle()`` dies with the last graph captured into it, so capturing again
        into it after every graph was dropped (a re-capture) trips the allocator's assert
        ``use_count > 0`` (seen on torch 2.11). ``MemPool`` holds a reference of its own."""
        mem_pool = getattr(torch.cuda, "MemPool", None)
        return mem_pool() if mem_pool is not None else torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], Any], pool: Any, warmup: int = 2) -> CudaGraph:
        t0 = time.perf_counter()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        current.wait_stream(side)
        torch.cuda.synchronize(self.device)
        # cached blocks could otherwise hide what the capture reserves for its pool (a capture is
        # rare: at start-up, or once per layout and bucket a switch has not met before)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        # thread-local: CUDA calls of other threads (NCCL's watchdog polling earlier work, say)
        # do not invalidate this thread's capture
        pool_id = getattr(pool, "id", pool)
        try:
            with torch.cuda.graph(graph, pool=pool_id, capture_error_mode="thread_local"):
                outputs = fn()
        except Exception:
            _stop_routing_to(self.device, pool_id)
            raise
        torch.cuda.synchronize(self.device)
        nbytes = max(0, torch.cuda.memory_reserved(self.device) - before)
        return CudaGraph(graph, outputs, time.perf_counter() - t0, nbytes)


def _stop_routing_to(device: torch.device, pool_id) -> None:
    """After a capture that failed: make sure the allocator no longer routes allocations into its
    pool. Where ending the capture raised before the allocator heard of it, the pool stays marked
    as recording, and the next ``empty_cache`` or the pool's release aborts the process on the
    allocator's assert ``captures_underway.empty()`` (seen on torch 2.11 when a step synchronised
    inside the capture). Where the allocator had been told, there is nothing to end: it says so,
    which is ignored."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is None or pool_id is None:
        return
    try:
        end(device.index if device.index is not None else torch.cuda.current_device(), pool_id)
    except RuntimeError:
        pass
