"""The cuda backend's peer memory on a real GPU. Two processes (on two GPUs, or sharing the one
there is: CUDA IPC works within a device too) allocate their buffers, exchange IPC handles over
gloo, and pull runs of bytes out of each other's buffers on a side stream, getting exactly the
peer's bytes (the conformance suite's check, ``splash_core.testing.cases.peer_memory``). And a
model whose KV pool lives in that memory computes the same logits as one whose pool does not.
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


def _same_step(ctx) -> float:
    """Largest logit difference between a model whose KV pool is the backend's peer memory and one
    whose pool is ordinary memory (same seeds): the kernels read the shared buffer alike."""
    from splash_core.runtime.switch import bench

    spec = dict(model="tiny-mla", dtype="bf16", kernels="backend", batch=4, page_size=16, rows=4, seed=0, initial="TP")
    batch = bench.synthetic_batch(4, 256, 4, 1, 16)
    out = []
    for memory in (None, ctx.backend.peer_memory(ctx.host_collectives(), ctx.device)):
        model = bench.build(ctx, spec, 3, 256, pulls=False, peer_memory=memory)
        assert (model.pool.buffer is not None) == (memory is not None)
        bench.fill(model, batch)
        out.append(model.step(batch, bench._tokens(ctx, model, batch)).float().cpu())
    return float((out[0] - out[1]).abs().max())


def test_pool_in_peer_memory_computes_as_ordinary_memory():
    from splash_core.runtime.spawn import RankPool

    with RankPool(1, backend="auto", timeout_s=300) as pool:
        assert pool.run(_same_step) == [0.0]
