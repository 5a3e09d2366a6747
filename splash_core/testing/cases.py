"""Checks that run on every rank of a conformance pool (module-level, so ranks can import
them). Each raises AssertionError naming what differed; the pool reports it with the rank."""

from __future__ import annotations

import torch

from ..platform.interfaces import Collectives, Work

WIDTH = 3  # channels per row in the collective checks


def _rows(src: int, dst: int, count: int, device, dtype=torch.float32):
    """Rows ``src`` sends ``dst``: each value says who sent it to whom and which row it is."""
    values = src * 1000 + dst * 100 + torch.arange(count, dtype=torch.float32)
    return values[:, None].expand(count, WIDTH).to(device=device, dtype=dtype)


def _exchange(ctx, send_count, dtype=torch.float32, async_op=False):
    """All-to-all where rank s sends ``send_count(s, d)`` rows to rank d; checks what arrives."""
    coll: Collectives = ctx.collectives
    me, size = coll.rank, coll.size
    in_splits = [send_count(me, d) for d in range(size)]
    out_splits = [send_count(s, me) for s in range(size)]
    parts = [_rows(me, d, n, ctx.device, dtype) for d, n in enumerate(in_splits)]
    inp = torch.cat(parts) if sum(in_splits) else torch.empty(0, WIDTH, device=ctx.device, dtype=dtype)
    out = torch.full((sum(out_splits), WIDTH), -1.0, device=ctx.device, dtype=dtype)
    work = coll.all_to_all(out, inp, out_splits, in_splits, async_op=async_op)
    if async_op:
        assert isinstance(work, Work), f"all_to_all(async_op=True) returned {work!r}, not a Work handle"
        work.wait()
    expected = [_rows(s, me, n, ctx.device, dtype) for s, n in enumerate(out_splits)]
    expected = torch.cat(expected) if sum(out_splits) else out
    assert torch.equal(out, expected), f"rank {me}: all_to_all splits {in_splits}->{out_splits} delivered {out.tolist()}"
    return out_splits


def all_gather(ctx, dtype):
    coll = ctx.collectives
    inp = torch.full((2, WIDTH), coll.rank + 1.0, device=ctx.device, dtype=dtype)
    out = torch.empty(2 * coll.size, WIDTH, device=ctx.device, dtype=dtype)
    work = coll.all_gather_into(out, inp, async_op=True)
    assert isinstance(work, Work), f"all_gather_into(async_op=True) returned {work!r}"
    work.wait()
    expected = torch.arange(1, coll.size + 1, device=ctx.device).repeat_interleave(2)[:, None].expand(-1, WIDTH)
    assert torch.equal(out, expected.to(dtype)), f"rank {coll.rank}: all_gather_into gave {out.tolist()}"


def uneven_all_to_all(ctx, dtype):
    """Different counts per pair, zeros included (rank s sends (s + 2d) % 3 rows to d)."""
    return _exchange(ctx, lambda s, d: (s + 2 * d) % 3, dtype)


def idle_rank_all_to_all(ctx, async_op):
    """Rank 0 sends and receives nothing while the others exchange."""
    return _exchange(ctx, lambda s, d: 0 if 0 in (s, d) else 1 + s + d, async_op=async_op)


def reduce_broadcast_objects(ctx):
    coll = ctx.collectives
    size, me = coll.size, coll.rank
    t = torch.full((4,), me + 1.0, device=ctx.device)
    coll.all_reduce(t)
    assert torch.equal(t, torch.full_like(t, size * (size + 1) / 2)), f"all_reduce gave {t.tolist()}"
    b = torch.full((3,), float(me), device=ctx.device)
    coll.broadcast(b, src=size - 1)
    assert torch.equal(b, torch.full_like(b, size - 1.0)), f"broadcast from {size - 1} gave {b.tolist()}"
    assert coll.all_gather_object({"rank": me}) == [{"rank": r} for r in range(size)]
    assert coll.broadcast_object(("from", me), src=0) == ("from", 0)
    coll.barrier()


def side_communicator(ctx):
    """A second communicator over the same ranks works beside the first."""
    side = ctx.side_collectives()
    t = torch.ones(2, device=ctx.device)
    work = side.all_reduce(t, async_op=True)
    main = torch.ones(2, device=ctx.device)
    ctx.collectives.all_reduce(main)
    work.wait()
    assert torch.equal(t, main) and t[0].item() == side.size, f"side all_reduce gave {t.tolist()}"


def peer_memory(ctx) -> str:
    """The backend's peer memory (if it has one): every rank pulls runs of bytes out of every
    peer's shared buffer on a side stream, uneven, empty and pitched (many-row) ones included,
    and gets exactly those bytes; its own buffer is untouched where nothing was pulled into it.
    Where the peer memory has a barrier (``PeerBuffers.barrier``), bytes a peer wrote before it
    are what a pull after it gets."""
    memory = ctx.peer_memory()
    if memory is None:
        return "none"
    me, size, nbytes = ctx.rank, ctx.world_size, 1 << 16
    buffer = memory.allocate(nbytes)
    assert tuple(buffer.shape) == (nbytes,) and buffer.dtype == torch.uint8, "allocate gives uint8 [nbytes]"
    assert buffer.device.type == torch.device(ctx.device).type and not buffer.any(), "allocate gives zeros"
    pattern = lambda r: (torch.arange(nbytes, device=ctx.device) * (r + 3) + r) % 251  # noqa: E731
    buffer.copy_(pattern(me).to(torch.uint8))
    ctx.streams.synchronize()
    peers = memory.share(buffer)  # every rank's buffer is written before any is shared
    # from each peer s: out of region s of its buffer, which no rank pulls into, into region s of
    # this one, which only s fills: three plain copies (one empty) and two pitched ones (one
    # spreading rows out, one gathering every third 40-byte row)
    region = nbytes // size
    runs = {s: [(s * region + s * 97 % 1024, s * region, 300 + s, 1, 300 + s, 300 + s),
                (s * region + 4000, s * region + 512, 0, 1, 0, 0),
                ((s + 1) * region - 1000, s * region + 1024, 1000, 1, 1000, 1000),
                (s * region + 2100 + s, s * region + 2048, 24, 7, 24, 64),
                (s * region + 3000, s * region + 2600, 40, 9, 120, 40)] for s in range(size) if s != me}
    side, done = ctx.streams.new_stream(), ctx.streams.new_event()
    with ctx.streams.use_stream(side):
        for s, rows in runs.items():
            peers.pull(s, rows)
        done.record(side)
    done.synchronize()
    ctx.host_collectives().barrier()  # no rank changes its buffer while a peer may still pull
    want = pattern(me).to(torch.uint8)
    for s, rows in runs.items():
        for src, dst, n, count, src_pitch, dst_pitch in rows:
            for j in range(count):
                a, b = src + j * src_pitch, dst + j * dst_pitch
                want[b: b + n] = pattern(s).to(torch.uint8)[a: a + n]
    got = buffer.cpu()
    assert torch.equal(got, want.cpu()), f"rank {me}: pulled bytes differ at {int((got != want.cpu()).nonzero()[0])}"
    barrier = getattr(peers, "barrier", None)
    if barrier is not None:
        _barrier_orders_pulls(ctx, peers, barrier, buffer, region, side)
    peers.close()
    return "pulled" if barrier is None else "pulled, barrier"


def _barrier_orders_pulls(ctx, peers, barrier, buffer, region: int, side) -> None:
    """The peer memory's barrier: each rank rewrites its own region (which only peers read) on
    a side stream right before the barrier; after it, every rank pulls each peer's region and
    gets the new bytes, every time."""
    me, size = ctx.rank, ctx.world_size
    mark = lambda r, k: (37 * r + 11 * k + 5) % 251  # noqa: E731
    for k in range(3):
        done = ctx.streams.new_event()
        with ctx.streams.use_stream(side):
            buffer[me * region: (me + 1) * region].fill_(mark(me, k))
            barrier(2 * k + 1, 60.0)
            for s in range(size):
                if s != me:
                    peers.pull(s, [(s * region, s * region, region, 1, region, region)])
            barrier(2 * k + 2, 60.0)  # no rank rewrites its region while a peer still pulls it
            done.record(side)
        done.synchronize()
        for s in range(size):
            if s != me:
                got = buffer[s * region: (s + 1) * region].cpu()
                assert bool((got == mark(s, k)).all()), f"rank {me}: round {k}: rank {s}'s region pulled before it was written"
