"""Pulled pages, without a switch: the pull routes and runs against the manifest, the pools laid
out in one shared buffer, and the reference backend's peer memory (files in shared memory).

- For random batches, every direction and T = 2, 3, 4: playing every rank's pull route (each
  source lists where the pages a peer fetches lie in its pool; the peer pulls them into pages
  it allocated) delivers each rank exactly the keys it fetches, with every page's contents
  from the page that holds it, and the byte runs cover exactly those pages.
- Runs of pages at constant steps (consecutive, or every T-th as CP holds them: one pitched
  copy) round-trip, are the longest ones left to right, and a source that lists the wrong
  number of pages is named.
- A KV pool in peer memory puts every layer's KV and indexer pages in one zeroed buffer at
  aligned offsets that are the same on every rank.
- Host peer memory: bytes pulled (plain and pitched copies) are the peer's, no file is ever left in ``/dev/shm`` (shared
  or not), a full shared-memory directory is a clear error, and ranks that disagree on the size
  fail alike.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import torch

from splash_core.layouts import DIRECTIONS, Primitive, State
from splash_core.planning import ownership
from splash_core.planning.manifest import plan_switch
from splash_core.platform.interfaces import PeerMemoryError
from splash_core.profiles.loader import load
from splash_core.reference import peer_memory
from splash_core.runtime.kv_pool import KVPool, LayerKV, PageFormat, held_pages
from splash_core.runtime.page_keys import PageKeys
from splash_core.runtime.switch import page_pulls

PROFILE = load("model", "tiny-mla")
PAGE = 16


def _batch(rng, T: int) -> ownership.Batch:
    n = int(rng.integers(1, 6))
    return ownership.Batch(tuple(ownership.Request(i, int(rng.integers(0, 90)), int(rng.integers(0, T)), 1)
                                 for i in range(n)))


def _pools(layout, batch, T, pages=64, width=2):
    """Per rank, a pool holding its pages of ``batch`` in ``layout``, in a scattered physical order,
    each page filled with a value naming its (request, logical page)."""
    pools = []
    for r in range(T):
        pool = LayerKV(0, pages, PageFormat(1, width, torch.float32), "cpu")
        pool.alloc(999, np.arange(r + 3))  # someone else's pages first, so physical pages differ per rank
        for q in batch.requests:
            held = held_pages(layout, q.id, q.owner, np.arange(-(-q.context // PAGE)), r, T)
            physical = pool.alloc(q.id, held)
            pool.kv[torch.as_tensor(physical)] = torch.as_tensor(q.id * 1000.0 + held, dtype=torch.float32)[:, None, None]
        pool.free(999)
        pools.append(pool)
    return pools


@pytest.mark.parametrize("T", [2, 3, 4])
def test_pull_routes_deliver_each_page_from_its_holder(T):
    rng = np.random.default_rng(10 + T)
    for _ in range(6):
        batch = _batch(rng, T)
        for src, dst in DIRECTIONS:
            plan = plan_switch(src, dst, batch, PROFILE, T, PAGE).layers[0].states[State.KV]
            if plan.primitive is Primitive.DISCARD:
                continue
            pools = _pools(src, batch, T)
            routes = [page_pulls.build_route(plan, r, T) for r in range(T)]
            shared = [page_pulls.where_sent(pools[r], routes[r]) for r in range(T)]
            breaks = [page_pulls.arriving_breaks(pools[r].placement(routes[r].arriving), routes[r].from_each)
                      for r in range(T)]
            counted, copies = page_pulls.copies(list(zip(shared, breaks))), 0
            for r in range(T):  # every rank pulls (sources are only read), then every rank retires
                route, pool = routes[r], pools[r]
                places = page_pulls.received_places(shared, 0, r, route)
                arriving = pool.alloc_keys(route.arriving)
                first, page_bytes = 0, pool.format.kv_page_bytes
                buffer = pool.kv.view(-1).view(torch.uint8)
                for s, count in enumerate(route.from_each.tolist()):
                    if not count:
                        assert places[s] is None
                        continue
                    runs = page_pulls.pull_runs(places[s], arriving[first: first + count])
                    copies += len(runs)
                    # each request's pages lie at one step in its holder's pool (every T-th where
                    # CP splits them) and the free pages here break once: a copy per request, +1
                    assert len(runs) <= len(batch.requests) + 1, (src, dst, runs.tolist())
                    for side, want in ((0, places[s]), (1, arriving[first: first + count])):  # runs cover both, in order
                        assert page_pulls.expand(runs[:, [side, 2, 3 + side]]).tolist() == want.tolist()
                    source = pools[s].kv.view(-1).view(torch.uint8)
                    for a, b, n, rows, a_pitch, b_pitch in page_pulls.byte_runs(runs, 0, page_bytes).tolist():
                        for j in range(rows):
                            buffer[b + j * b_pitch: b + j * b_pitch + n] = source[a + j * a_pitch: a + j * a_pitch + n]
                    first += count
            # the agreement's count, from each side's runs alone, bounds the copies made
            assert copies <= counted <= 2 * copies, (src, dst, copies, counted)
            for r in range(T):
                pool = pools[r]
                pool.free_keys(routes[r].freed)
                for q in batch.requests:  # exactly the destination's pages, each with its own contents
                    want = held_pages(dst, q.id, q.owner, np.arange(-(-q.context // PAGE)), r, T)
                    logical, physical = pool.pages_of(q.id)
                    assert logical.tolist() == want.tolist(), f"{src}->{dst} rank {r} request {q.id}"
                    values = pool.kv[torch.as_tensor(physical), 0, 0].tolist()
                    assert values == (q.id * 1000.0 + logical).tolist(), f"{src}->{dst} rank {r}: wrong contents"


def test_runs_round_trip_and_joint_runs_break_on_either_side():
    pages = np.array([4, 5, 6, 9, 10, 2, 3, 3 + 1, 11])
    runs = page_pulls.runs(pages)
    assert runs.tolist() == [[4, 3, 1], [9, 2, 1], [2, 3, 1], [11, 1, 1]]
    assert page_pulls.expand(runs).tolist() == pages.tolist()
    assert page_pulls.expand(page_pulls.runs(np.zeros(0))).size == 0
    src, dst = np.array([7, 8, 9, 10, 20]), np.array([0, 1, 5, 6, 7])
    assert page_pulls.pull_runs(src, dst).tolist() == [[7, 0, 2, 1, 1], [9, 5, 2, 1, 1], [20, 7, 1, 1, 1]]
    assert page_pulls.byte_runs(np.array([[7, 0, 2, 1, 1]]), 100, 8).tolist() == [[156, 100, 16, 1, 16, 16]]


def test_every_t_th_page_is_one_run_and_one_pitched_copy():
    cp_pages = np.concatenate([np.arange(0, 20, 2), np.arange(41, 50, 2)])  # two requests, every other page
    assert page_pulls.runs(cp_pages).tolist() == [[0, 10, 2], [41, 5, 2]]
    assert page_pulls.expand(page_pulls.runs(cp_pages)).tolist() == cp_pages.tolist()
    pulled = page_pulls.pull_runs(cp_pages, np.arange(100, 115))
    assert pulled.tolist() == [[0, 100, 10, 2, 1], [41, 110, 5, 2, 1]]
    assert page_pulls.byte_runs(pulled, 1000, 8).tolist() == [[1000, 1800, 8, 10, 16, 8], [1328, 1880, 8, 5, 16, 8]]
    assert page_pulls.runs(cp_pages, pitched=False).tolist() == [[p, 1, 1] for p in cp_pages]  # transfer.pitched_pulls off
    assert len(page_pulls.pull_runs(cp_pages, np.arange(100, 115), pitched=False)) == 15
    assert page_pulls.pull_runs(np.array([5, 3, 1]), np.array([0, 1, 2])).tolist() == [  # no negative pitches
        [5, 0, 1, 1, 1], [3, 1, 1, 1, 1], [1, 2, 1, 1, 1]]


def _greedy_runs(x: np.ndarray) -> list[list[int]]:
    """The cut :func:`page_pulls.progressions` makes, one row at a time."""
    out, i = [], 0
    while i < len(x):
        j = i + 1
        if j < len(x) and (x[j] > x[i]).all():
            while j + 1 < len(x) and (x[j + 1] - x[j] == x[i + 1] - x[i]).all():
                j += 1
            out.append([i, j - i + 1])
            i = j + 1
        else:
            out.append([i, 1])
            i += 1
    return out


def test_progressions_are_the_longest_runs_left_to_right():
    rng = np.random.default_rng(3)
    for _ in range(3000):
        m, c = int(rng.integers(0, 16)), int(rng.integers(1, 3))
        x = rng.integers(0, 20, (m, c)) if rng.random() < 0.3 else rng.integers(-1, 4, (m, c)).cumsum(axis=0)
        assert page_pulls.progressions(x).tolist() == _greedy_runs(x), x.tolist()


def test_pulls_only_where_runs_are_long_enough():
    assert page_pulls.worth_pulling(12, 3, 100, 400)  # 12 pages of 100 bytes in 3 copies: 400 bytes a copy
    assert not page_pulls.worth_pulling(12, 3, 100, 401)
    assert page_pulls.worth_pulling(0, 0, 100, 1 << 30)  # nothing to pull


def test_the_shortest_run_worth_a_pull_is_the_peer_memorys_unless_set():
    from splash_core.profiles.transfer import TransferConfig
    from splash_core.runtime.switch.pages_mover import PagesMover

    default = PagesMover()
    assert default.min_run_bytes(peer_memory.HostPeerBuffers(None, [])) == 64 << 10
    assert default.min_run_bytes(object()) == 0
    assert PagesMover(TransferConfig(min_run_bytes=0)).min_run_bytes(peer_memory.HostPeerBuffers(None, [])) == 0


def test_a_source_listing_the_wrong_pages_is_named():
    batch = ownership.Batch((ownership.Request(0, 64, 1, 1),))
    plan = plan_switch("DP", "TP", batch, PROFILE, 2, PAGE).layers[0].states[State.KV]
    route = page_pulls.build_route(plan, 0, 2)
    shared = [[None, None], [page_pulls.runs(np.arange(2)), None]]  # rank 1 sends 2 of 4 pages
    with pytest.raises(RuntimeError, match="layer 3: rank 1 lists 2 pages for rank 0, whose plan fetches 4"):
        page_pulls.received_places(shared, 3, 0, route)


class _OneRank:
    rank, size = 0, 1

    def all_gather_object(self, obj):
        return [obj]

    def barrier(self):
        pass


def test_kv_pool_in_peer_memory_is_one_aligned_zeroed_buffer():
    fmt = PageFormat(4, 3, torch.bfloat16, indexer_width=5, indexer_dtype=torch.float32)
    pool = KVPool([0, 2], 7, fmt, "cpu", memory=peer_memory.HostPeerMemory(_OneRank()))
    per_layer = KVPool.layer_bytes(7, fmt)
    assert pool.buffer.numel() == 2 * per_layer and not pool.buffer.any()
    for k, layer in enumerate(pool.layers.values()):
        assert layer.offsets == {State.KV: k * per_layer, State.INDEXER: k * per_layer + 512}
        for state, tensor in ((State.KV, layer.kv), (State.INDEXER, layer.indexer)):
            assert tensor.untyped_storage().data_ptr() == pool.buffer.untyped_storage().data_ptr()
            assert tensor.data_ptr() - pool.buffer.data_ptr() == layer.offsets[state]
    layer = pool[2]
    layer.kv[3] = 1.5  # a page written through its view is in the buffer where the offsets say
    start = layer.offsets[State.KV] + 3 * fmt.kv_page_bytes
    assert pool.buffer[start: start + fmt.kv_page_bytes].view(torch.bfloat16).eq(1.5).all()


def _peer_files() -> set[str]:
    return set(glob.glob(os.path.join(peer_memory._shared_dir(), "splash-peer-*")))


def _host_pulls(ctx, nbytes):
    memory = ctx.peer_memory()
    before = _peer_files()
    buffer = memory.allocate(nbytes)
    buffer.copy_(torch.arange(nbytes, dtype=torch.int64).mul(ctx.rank + 1).remainder(256).to(torch.uint8))
    peers = memory.share(buffer)
    left = _peer_files() - before
    peer = (ctx.rank + 1) % ctx.world_size
    expected = torch.arange(nbytes, dtype=torch.int64).mul(peer + 1).remainder(256).to(torch.uint8)
    region, me = nbytes // ctx.world_size, ctx.rank  # region r of a buffer: rank r pulls into it, reads it of peers
    got = buffer.clone()
    half = region // 2  # a plain copy of the first half, a pitched one of every other 8 bytes of the second
    peers.pull(peer, [(me * region, me * region, half, 1, half, half),
                      (me * region + half, me * region + half, 8, half // 16, 16, 16)])
    got[me * region: me * region + half] = expected[me * region: me * region + half]
    for j in range(half // 16):
        at = me * region + half + 16 * j
        got[at: at + 8] = expected[at: at + 8]
    ctx.host_collectives().barrier()
    ok = torch.equal(buffer, got)
    try:
        memory.share(memory.allocate(nbytes + ctx.rank))
    except PeerMemoryError as exc:
        mismatch = str(exc)
    return ok, sorted(left), mismatch


def test_host_peer_memory_pulls_and_leaves_no_files(rank_pools):
    out = rank_pools(2).run(_host_pulls, 4096)
    for ok, left, mismatch in out:
        assert ok and not left, (ok, left)
        assert "buffers differ in size ([4096, 4097])" in mismatch
    assert not _peer_files()


def test_full_shared_memory_is_a_clear_error(monkeypatch):
    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    before = _peer_files()
    with pytest.raises(PeerMemoryError, match=r"rank 0: cannot reserve 123 bytes of shared memory in .*No space left"):
        peer_memory.HostPeerMemory(_OneRank()).allocate(123)
    assert _peer_files() == before  # the file it made is gone
    memory = peer_memory.HostPeerMemory(_OneRank())
    monkeypatch.undo()
    kept = memory.allocate(64)  # allocated, never shared: no file either
    assert kept.numel() == 64 and _peer_files() == before


def test_keys_of_pull_routes_match_the_plan():
    batch = ownership.Batch((ownership.Request(0, 40, 0, 1), ownership.Request(1, 70, 1, 1)))
    plan = plan_switch("CP", "TP", batch, PROFILE, 2, PAGE).layers[0].states[State.KV]
    for r in range(2):
        route, blocks = page_pulls.build_route(plan, r, 2), plan.rank(r)
        assert len(route.arriving) == len(blocks.fetched) == route.from_each.sum()
        assert route.sends[r] is None and len(route.sends[1 - r]) == len(blocks.sends[1 - r])
        assert isinstance(route.freed, PageKeys)
