"""The cuda backend's peer memory on a real GPU. Two processes (on two GPUs, or sharing the one
there is: CUDA IPC works within a device too) allocate their buffers, exchange IPC handles over
gloo, and pull runs of bytes out of each other's buffers on a side stream, getting exactly the
peer's bytes (the conformance suite's check, ``splash_core.testing.cases.peer_memory``, the
stream barrier included); a rank left waiting at the barrier by a peer that never comes ends,
after the timeout. And a model whose KV pool lives in that memory computes the same logits as
one whose pool does not.
Skipped without CUDA."""

from __future__ import annotations

import os
import time
import types

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _rank(rank: int, world: int, port: int, conn, case: str = "conformance") -> None:
    import torch.distributed as dist

    try:
        from splash_backend_cuda.peer_memory import CudaPeerMemory

        from splash_core.platform.collectives import DistCollectives
        from splash_core.platform.device_streams import DeviceStreamOps
        from splash_core.testing import cases

        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
        host = DistCollectives(dist.group.WORLD, torch.device("cpu"))
        memory = CudaPeerMemory(host, device)
        ctx = types.SimpleNamespace(rank=rank, world_size=world, device=device, streams=DeviceStreamOps(torch.cuda, device),
                                    peer_memory=lambda: memory, host_collectives=lambda: host)
        if case == "conformance":
            conn.send(cases.peer_memory(ctx))
        else:  # "late": rank 1 never reaches the barrier rank 0 waits at
            peers = memory.share(memory.allocate(4096))
            conn.send("sharing")
            if rank == 0:
                peers.barrier(1, 2.0)
                torch.cuda.synchronize()  # held until the watchdog ends this process
                conn.send("the barrier returned")
            else:
                time.sleep(60)
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        conn.send(f"{type(exc).__name__}: {exc}")


def _start(case: str):
    import multiprocessing as mp

    from splash_core.runtime.spawn import free_port

    spawn, port = mp.get_context("spawn"), free_port()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    pipes = [spawn.Pipe() for _ in range(2)]
    procs = [spawn.Process(target=_rank, args=(r, 2, port, pipes[r][1], case)) for r in range(2)]
    for p in procs:
        p.start()
    return procs, pipes


def test_cuda_ipc_pulls_exact_bytes():
    procs, pipes = _start("conformance")
    got = [pipes[r][0].recv() if pipes[r][0].poll(120) else "timed out" for r in range(2)]
    for p in procs:
        p.join(30)
    assert got == ["pulled, barrier", "pulled, barrier"], got  # stream memory operations on every CUDA driver here


def test_a_peer_that_never_reaches_the_barrier_ends_the_waiting_process():
    """A stream waiting at the barrier cannot be interrupted: after the timeout the watchdog ends
    the process (SIGABRT), as NCCL's does for a hung collective."""
    procs, pipes = _start("late")
    try:
        assert [pipes[r][0].recv() if pipes[r][0].poll(120) else "timed out" for r in range(2)] == ["sharing"] * 2
        procs[0].join(60)
        assert procs[0].exitcode == -6, procs[0].exitcode
        assert not pipes[0][0].poll(0), pipes[0][0].recv()
    finally:
        for p in procs:
            p.kill()
            p.join(10)


def _same_step(ctx) -> float:
    """Largest logit difference between a model whose KV pool is the backend's peer memory and one
    whose pool is ordinary memory (same seeds): the kernels read the shared buffer alike."""
    from splash_bench import switch as bench

    spec = dict(model="tiny-mla", dtype="bf16", kernels="backend", batch=4, page_size=16, rows=4, seed=0, initial="TP")
    batch = bench.synthetic_batch(4, 256, 4, 1, 16)
    out = []
    for memory in (None, ctx.backend.peer_memory(ctx.host_collectives(), ctx.device)):
        model = bench.build(ctx, spec, 3, 256, peer_memory=memory)
        assert (model.pool.buffer is not None) == (memory is not None)
        bench.fill(model, batch)
        out.append(model.step(batch, bench._tokens(ctx, model, batch)).float().cpu())
    return float((out[0] - out[1]).abs().max())


def test_pool_in_peer_memory_computes_as_ordinary_memory():
    from splash_core.runtime.spawn import RankPool

    with RankPool(1, backend="auto", timeout_s=300) as pool:
        assert pool.run(_same_step) == [0.0]
