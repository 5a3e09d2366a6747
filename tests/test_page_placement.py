"""Where a pool puts new pages (:mod:`splash_core.runtime.page_placement`): histories grown a
page at a time by a whole batch stay in one run each, a batch opening together spreads over
the pool, a fragmented pool is filled from its largest gaps, every page handed out was free,
and :meth:`BlockTables.placement` answers what the allocation then gives."""

from __future__ import annotations

import numpy as np

from splash_core.runtime.block_tables import BlockTables, PageKeys, PoolFullError
from splash_core.runtime.page_placement import place
from splash_core.runtime.switch.page_pulls import runs

from bench_scripts import load_bench


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


def test_a_fragmented_pool_is_filled_from_its_largest_gaps_first():
    free = np.zeros(16, dtype=bool)
    free[[0, 1, 2, 5, 6, 7, 8, 9, 12, 13]] = True  # gaps of 3, 5 and 2 pages
    assert place(free, np.array([-1]), np.array([7])).tolist() == [5, 6, 7, 8, 9, 0, 1]
    assert place(free, np.array([-1]), np.array([9])).tolist() == [12, 13, 2]  # fewer where fewer are free


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
