"""Where a pool puts new pages (:mod:`splash_core.runtime.page_placement`): histories grown a
page at a time by a whole batch stay in one run each, a batch opening together spreads over
the pool, a pool without a gap large enough gives its lowest free pages (the holes a discard
left: a pitched run), every page handed out was free,
and :meth:`BlockTables.placement` answers what the allocation then gives."""

from __future__ import annotations

import numpy as np
from bench_scripts import load_bench

from splash_core.runtime.block_tables import BlockTables
from splash_core.runtime.page_keys import PageKeys, PoolFullError
from splash_core.runtime.page_placement import continue_runs, place
from splash_core.runtime.switch.page_pulls import runs


def test_histories_grown_page_by_page_side_by_side_stay_in_one_run_each():
    pool = BlockTables(0, 4096)
    for rid in range(8):
        pool.alloc(rid, np.arange(16))  # prefill
    for page in range(16, 200):  # decode: every request opens its next page in turn
        for rid in range(8):
            pool.alloc(rid, [page])
    for rid in range(8):
        logical, physical = pool.pages_of(rid)
        assert logical.tolist() == list(range(200))
        assert len(runs(physical, pitched=False)) == 1, f"request {rid}: {runs(physical, pitched=False).tolist()}"


def test_pages_coming_back_fill_the_holes_a_discard_left():
    pool = BlockTables(0, 64)
    for rid in range(3):
        pool.alloc(rid, np.arange(16))  # whole histories, as TP holds them
    before = {rid: pool.pages_of(rid)[1].tolist() for rid in range(3)}
    odd = PageKeys.of([[rid, p] for rid in range(3) for p in range(1, 16, 2)])
    pool.free_keys(odd)  # a switch to CP at T = 2 keeps every other page
    pool.alloc_keys(odd)  # and back to TP
    assert {rid: pool.pages_of(rid)[1].tolist() for rid in range(3)} == before


def test_runs_continue_after_their_anchor_as_far_as_pages_are_free():
    free = np.ones(12, dtype=bool)
    free[[4, 9]] = False
    got = continue_runs(free, np.array([2, -1, 7, 11]), np.array([4, 2, 2, 3]))
    assert got.tolist() == [2, 3, -1, -1, -1, -1, 7, 8, 11, -1, -1]  # a run stops at its first taken page
    assert not free[[2, 3, 7, 8, 11]].any() and free[[0, 1, 5, 6, 10]].all()


def test_a_batch_opening_together_halves_the_pool_s_gaps():
    pool = BlockTables(0, 64)
    assert [int(pool.alloc(rid, [0])[0]) for rid in range(4)] == [0, 32, 16, 48]


def test_new_pages_continue_after_the_last_page_below_them():
    free = np.ones(20, dtype=bool)
    free[[5, 6, 12]] = False
    got = place(free, np.array([3, 13, -1]), np.array([4, 2, 1]))
    # 3, 4, then 5 is taken: the rest in the middle of the largest gap (13..19); 13, 14 from
    # the second anchor; one page for a request without pages: mid-way in the largest gap left (7..11)
    assert got.tolist() == [3, 4, 15, 16, 13, 14, 9]
    assert not free[got].any() and free.sum() == 20 - 3 - 7


def test_without_a_gap_large_enough_the_lowest_free_pages_go():
    free = np.zeros(16, dtype=bool)
    free[[0, 1, 2, 5, 6, 7, 8, 9, 12, 13]] = True  # gaps of 3, 5 and 2 pages
    assert place(free, np.array([-1]), np.array([7])).tolist() == [0, 1, 2, 5, 6, 7, 8]
    assert place(free, np.array([-1]), np.array([9])).tolist() == [9, 12, 13]  # fewer where fewer are free
    every_other = np.arange(4000) % 2 == 1  # what a discard to CP leaves at T = 2
    got = place(every_other, np.array([-1, -1]), np.array([700, 600]))
    assert [runs(got[:700]).tolist(), runs(got[700:]).tolist()] == [[[1, 700, 2]], [[1401, 600, 2]]]  # pitched runs


def test_placement_is_what_the_allocation_gives_and_hands_out_free_pages_once():
    rng = np.random.default_rng(0)
    pool = BlockTables(0, 300)
    grown = {}
    for _ in range(400):
        rid = int(rng.integers(0, 12))
        if rng.random() < 0.2 and rid in grown:
            pool.free(rid)
            del grown[rid]
            continue
        first = grown.get(rid, 0)
        keys = PageKeys.one(rid, np.arange(first, first + int(rng.integers(1, 20))))
        want = pool.placement(keys)
        free_before = pool.free_pages
        try:
            got = pool.alloc_keys(keys)
        except PoolFullError:
            assert want.size < len(keys) and pool.free_pages == free_before
            continue
        assert got.tolist() == want.tolist() and len(set(got.tolist())) == len(keys)
        grown[rid] = first + len(keys)
        held = np.concatenate([pool.pages_of(r)[1] for r in pool.requests])
        assert held.size == len(set(held.tolist())) == pool.used_pages


def _random_workload(seed: int):
    """Random allocations (new requests, growth, pages coming back into holes) and frees of one
    pool, as (op, keys) pairs built as it goes: the pages each allocation got."""
    rng = np.random.default_rng(seed)
    pool, got = BlockTables(0, 600), []
    for _ in range(120):
        rid = int(rng.integers(0, 10))
        logical, _ = pool.pages_of(rid)
        if rng.random() < 0.3 and logical.size:
            pool.free(rid, logical[rng.random(logical.size) < 0.5])
            continue
        top = int(logical.max(initial=-1)) + 1
        wanted = np.setdiff1d(np.arange(top + int(rng.integers(1, 90))), logical)
        try:
            got.append(pool.alloc_keys(PageKeys.one(rid, wanted)).tolist())
        except PoolFullError:
            got.append(None)
    return got


def test_key_by_key_array_and_remembered_placements_agree(monkeypatch):
    from splash_core.runtime import block_tables

    answers = []
    for few, memo in ((0, 1 << 30), (1 << 30, 1 << 30), (0, 0)):
        monkeypatch.setattr(block_tables, "FEW_KEYS", few)
        monkeypatch.setattr(block_tables, "MEMO_KEYS", memo)
        answers.append([_random_workload(seed) for seed in range(4)])
    assert answers[0] == answers[1] == answers[2]


def test_layers_in_one_state_share_a_placement_and_others_do_not():
    a, b, c = (BlockTables(i, 4096) for i in range(3))
    for pool in (a, b, c):
        for rid in range(4):
            pool.alloc(rid, np.arange(0, 400, 2))
    c.alloc(9, [0])  # c is in another state
    keys = PageKeys.of([[rid, p] for rid in range(4) for p in range(1, 400, 2)])
    first = a.alloc_keys(keys)
    assert keys.placed((c._free.copy(), np.ones(4, bool), c._table[c._rows(keys.requests)])) is None
    assert b.alloc_keys(keys).tolist() == first.tolist()
    fresh = BlockTables(5, 4096)
    for rid in range(4):
        fresh.alloc(rid, np.arange(0, 400, 2))
    fresh.alloc(9, [0])
    assert c.alloc_keys(keys).tolist() == fresh.alloc_keys(PageKeys.of(np.stack([np.asarray(keys.requests)[keys.slot],
                                                                                  keys.pages], axis=1))).tolist()


def test_the_page_runs_bench_finds_pullable_histories():
    bench = load_bench("page_runs")
    args = bench.parse_args(["--batch", "6", "--prompt", "64-512", "--output", "256-4096", "--chunk", "256",
                             "--steps", "6000", "--snapshots", "2", "--min-run-bytes", str(4 * 64 * 576 * 2),
                             "--no-write"])
    cases = bench.run(args)
    assert [(c["scenario"], c["pool"]) for c in cases] == [("rollout", "roomy"), ("rollout", "tight"),
                                                           ("serving", "roomy"), ("serving", "tight")]
    for case in cases:
        assert case["snapshots"] and case["peak_used_pages"] <= case["pool_pages"]
        for snap in case["snapshots"]:
            assert snap["pages"] == sum(p for p, _, _ in snap["per_request"])
            assert snap["pulled"], f"{case['scenario']} ({case['pool']}): {snap['pages_per_run']:.1f} pages a run"
