"""Page bookkeeping of the live switch, without ranks: the KV pool's vectorised key operations
against its one-request operations, and the pages mover's chunked routes against the manifest.

- ``LayerKV.lookup/alloc_keys/free_keys`` (array operations over many requests' pages) leave
  every request holding the same logical pages as the same work done one request at a time,
  every physical page held once or free once, and a refused call (pool full, a page already
  held) changes nothing; looking up a page not held names it.
- Block tables built from the dense table list each request's held pages in logical order.
- For random batches, every direction and T = 2, 3, with chunks small enough to cut a layer's
  pages many times: playing every rank's route through simulated collectives (all-to-all by
  splits, all-gather of the padded payloads) delivers to each rank exactly the keys it fetches,
  in the order its unpack slots expect, and each rank then holds exactly the destination's keys.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splash_core.layouts import DIRECTIONS, Primitive, State
from splash_core.planning import ownership
from splash_core.planning.manifest import plan_switch
from splash_core.profiles.loader import load
from splash_core.profiles.transfer import TransferConfig
from splash_core.runtime.kv_pool import LayerKV, PageFormat, held_pages
from splash_core.runtime.page_keys import PageKeys, PoolFullError
from splash_core.runtime.switch import pages_mover

PROFILE = load("model", "tiny-mla")


def _pool(pages=64) -> LayerKV:
    return LayerKV(0, pages, PageFormat(4, 3, torch.float32), "cpu")


def _state(kv: LayerKV):
    return (kv.free_pages, kv.version, {r: tuple(map(tuple, kv.pages_of(r))) for r in kv.requests},
            kv._free.tolist())


def _logical(kv: LayerKV) -> dict:
    """Logical pages per request, after checking every physical page is held once or free once."""
    held = [p for r in kv.requests for p in kv.pages_of(r)[1].tolist()]
    assert sorted(held + np.flatnonzero(kv._free).tolist()) == list(range(kv.num_pages))
    return {r: kv.pages_of(r)[0].tolist() for r in kv.requests}


def _random_keys(rng, requests, max_page, n) -> np.ndarray:
    keys = {(int(rng.choice(requests)), int(rng.integers(0, max_page))) for _ in range(n)}
    keys = np.array(sorted(keys), dtype=np.int64).reshape(-1, 2)
    return keys[rng.permutation(len(keys))]  # any order: the fallback path of PageKeys.of


def test_page_keys_group_requests_and_reject_repeats():
    grouped = np.array([[7, 0], [7, 2], [3, 1], [3, 4], [9, 0]])
    for keys in (grouped, grouped[[4, 0, 2, 1, 3]]):
        k = PageKeys.of(keys)
        assert [k.requests[j] for j in k.slot] == keys[:, 0].tolist() and k.pages.tolist() == keys[:, 1].tolist()
        assert dict(zip(k.requests, k.counts.tolist())) == {7: 2, 3: 2, 9: 1} and k.max_page == 4
    with pytest.raises(ValueError, match="repeat"):
        PageKeys.of([[1, 2], [3, 0], [1, 2]])
    with pytest.raises(ValueError, match="repeat"):
        PageKeys.one(1, [0, 0])
    assert len(PageKeys.of(np.zeros((0, 2)))) == 0


@pytest.mark.parametrize("seed", range(6))
def test_key_operations_match_one_request_at_a_time(seed):
    rng = np.random.default_rng(seed)
    vector, single = _pool(), _pool()
    for _ in range(30):
        keys = _random_keys(rng, [1, 5, 8, 13], 40, int(rng.integers(1, 25)))
        k = PageKeys.of(keys)
        by_request = {int(r): keys[keys[:, 0] == r, 1] for r in np.unique(keys[:, 0])}
        if rng.random() < 0.5:
            before = _state(vector)
            try:
                got = vector.alloc_keys(k)
            except (PoolFullError, ValueError):
                assert _state(vector) == before, "a refused allocation changed the pool"
                continue
            for rid, pages in by_request.items():
                single.alloc(rid, pages)
            assert (got == vector.lookup(k)).all()
        else:
            assert vector.free_keys(k) == sum(single.free(r, p) for r, p in by_request.items())
        assert _logical(vector) == _logical(single) and vector.free_pages == single.free_pages
        held = [kk for kk in map(tuple, keys) if kk[1] in vector.pages_of(kk[0])[0]]
        if len(held) < len(keys):
            with pytest.raises(RuntimeError, match="holds no page"):
                vector.lookup(k)


def test_block_tables_list_held_pages_in_logical_order():
    rng = np.random.default_rng(3)
    kv = _pool(200)
    for rid in range(6):
        kv.alloc(rid, np.flatnonzero(rng.random(30) < 0.5))
    ids = (4, 0, 99, 2, 5, 1, 3)
    table, index = kv.block_table(ids)
    for row, rid in enumerate(ids):
        logical, physical = kv.pages_of(rid)
        n = len(logical)
        assert table[row, :n].tolist() == physical.tolist() and index[row, :n].tolist() == logical.tolist()
        assert (table[row, n:] == -1).all() and (index[row, n:] == -1).all()


# ---- routes: every rank's chunks, played through simulated collectives -------------------------

def _batch(rng, T):
    n = int(rng.integers(1, 6))
    ids = rng.choice(50, n, replace=False)
    return ownership.Batch(tuple(ownership.Request(int(i), int(rng.integers(0, 120)), int(rng.integers(0, T)))
                                 for i in ids))


def _play(plan, T, page_bytes):
    """Per rank, the keys each unpack slot receives, in arriving order, by simulating the chunks."""
    cfg = TransferConfig()
    routes = [pages_mover._build_route(plan, r, T, page_bytes, cfg.max_chunks, cfg.chunk_bytes) for r in range(T)]
    assert len({len(r.cuts) for r in routes}) == 1, "ranks disagree on the number of chunks"
    sent = [np.concatenate([np.stack([np.array(r.sending.requests)[r.sending.slot], r.sending.pages], 1),
                            np.full((r.send_rows - len(r.sending), 2), -1)]) for r in routes]  # -1: padding
    got = [[] for _ in range(T)]
    for k in range(len(routes[0].cuts)):
        cuts = [r.cuts[k] for r in routes]
        for q in range(T):
            if plan.primitive is Primitive.ALL_GATHER:
                out = np.concatenate([sent[s][c.send_lo: c.send_hi] for s, c in enumerate(cuts)])
            else:
                parts = []
                for s, c in enumerate(cuts):
                    lo = c.send_lo + sum(c.splits[0][:q])
                    parts.append(sent[s][lo: lo + c.splits[0][q]])
                    assert c.splits[0][q] == cuts[q].splits[1][s], "send and receive splits disagree"
                out = np.concatenate(parts)
            assert len(out) == cuts[q].recv_rows
            for first, n, at in cuts[q].slots:
                assert at == len(np.concatenate(got[q] or [np.zeros((0, 2))])), "slots out of arriving order"
                got[q].append(out[first: first + n])
    return routes, [np.concatenate(g) if g else np.zeros((0, 2), np.int64) for g in got]


@pytest.mark.parametrize("T", [2, 3])
def test_routes_deliver_exactly_the_fetched_pages(T):
    rng = np.random.default_rng(T)
    for _ in range(8):
        batch = _batch(rng, T)
        for src, dst in DIRECTIONS:
            plan = plan_switch(src, dst, batch, PROFILE, T, 16).layers[0].states[State.KV]
            page_bytes = int(rng.choice([1, 7, 1 << 30]))  # many chunks, a few, one
            routes, got = _play(plan, T, page_bytes)
            for r in range(T):
                blocks, route = plan.rank(r), routes[r]
                arriving = np.stack([np.array(route.arriving.requests, dtype=np.int64)[route.arriving.slot],
                                     route.arriving.pages], 1) if len(route.arriving) else np.zeros((0, 2), np.int64)
                assert got[r].tolist() == arriving.tolist(), f"{src}->{dst} rank {r}: wrong pages or order"
                assert sorted(map(tuple, arriving.tolist())) == sorted(map(tuple, blocks.fetched.tolist()))
                after = set(map(tuple, blocks.kept.tolist())) | set(map(tuple, arriving.tolist()))
                hist = {(q.id, p) for q in batch.requests for p in range(-(-q.context // 16))}
                want = {(i, p) for i, p in hist if r in _holders(dst, i, p, batch, T)}
                assert after == want, f"{src}->{dst} rank {r}: holds the wrong pages after the move"
                assert len(route.cuts) <= TransferConfig().max_chunks


def _holders(layout, rid, page, batch, T):
    owner = next(q.owner for q in batch.requests if q.id == rid)
    return {r for r in range(T) if held_pages(layout, rid, owner, [page], r, T).size}


def test_placement_lists_the_pages_the_next_allocation_takes():
    kv = _pool(16)
    assert kv.placement(PageKeys.one(1, np.arange(5))).tolist() == [0, 1, 2, 3, 4]  # a fresh pool starts at 0
    kv.alloc(1, np.arange(8))
    kv.free(1, [1, 3, 5])  # free: 1, 3, 5 and 8..15
    keys = PageKeys.of([[2, p] for p in range(6)])
    taken = kv.placement(keys)
    assert kv.alloc_keys(keys).tolist() == taken.tolist() == [9, 10, 11, 12, 13, 14]  # mid-gap: room on both sides
    assert kv.placement(PageKeys.one(3, np.arange(99))).size == kv.free_pages
    grown = PageKeys.one(2, [6, 7])
    assert kv.placement(grown).tolist() == [15, 1]  # on from its last page, then the first largest gap
    kv.free(2, [0])  # the pool changed (page 9 is free again): the allocation places afresh
    assert kv.alloc_keys(grown).tolist() == [15, 8]
