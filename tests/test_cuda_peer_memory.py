"""The cuda backend's peer memory on a real GPU: two processes (on two GPUs, or sharing the one
there is: CUDA IPC works within a device too) allocate their buffers, exchange IPC handles over
gloo, and pull runs of bytes out of each other's buffers on a side stream, getting exactly the
peer's bytes (the conformance suite's check, ``splash_core.testing.cases.peer_memory``).
Skipped without CUDA."""

from __future__ import annotations

import os
import types

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _rank(rank: int, world: int, port: int, conn) -> None:
    import torch.distributed as dist

    try:
        from splash_backend_cuda.peer_memory import CudaPeerMemory

        from splash_core.collectives import DistCollectives
        from splash_core.device_streams import DeviceStreamOps
        from splash_core.testing import cases

        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
        host = DistCollectives(dist.group.WORLD, torch.device("cpu"))
        memory = CudaPeerMemory(host, device)
        ctx = types.SimpleNamespace(rank=rank, world_size=world, device=device, streams=DeviceStreamOps(torch.cuda, device),
                                    peer_memory=lambda: memory, host_collectives=lambda: host)
        conn.send(cases.peer_memory(ctx))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        conn.send(f"{type(exc).__name__}: {exc}")


def test_cuda_ipc_pulls_exact_bytes():
    import multiprocessing as mp

    from splash_core.runtime.spawn import free_port

    spawn, port = mp.get_context("spawn"), free_port()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    pipes = [spawn.Pipe() for _ in range(2)]
    procs = [spawn.Process(target=_rank, args=(r, 2, port, pipes[r][1])) for r in range(2)]
    for p in procs:
        p.start()
    got = [pipes[r][0].recv() if pipes[r][0].poll(120) else "timed out" for r in range(2)]
    for p in procs:
        p.join(30)
    assert got == ["pulled", "pulled"], got
