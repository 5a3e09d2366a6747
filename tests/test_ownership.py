"""Footprints (Eq 1), the longest balanced context, busiest-rank loads (Table 2) and owner
assignment."""

from __future__ import annotations

import math

import blocks
import numpy as np
import pytest
from table2_loads import causal_pairs, loads
from test_manifest import HYBRID, MLA

from splash_core.layouts import LAYOUTS, Layout
from splash_core.planning.ownership import (Batch, Request, assign_owner, assign_owners, cp_prefix_matrix,
                                            cp_rank_of_page, eq1_footprint, eq1_longest_context, footprint,
                                            longest_balanced_context)
from splash_core.planning.weight_bytes import weight_report
from splash_core.profiles import load

GIB = 1 << 30


@pytest.mark.parametrize("model_name", ["deepseek-v3", "deepseek-v3.2", "glm-5.3"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_footprint_is_eq1_when_balanced(model_name, layout):
    model = load("model", model_name)
    T, B, page = 8, 16, 64
    s = 3 * T * page  # whole pages, a multiple of T per request: Eq 1 holds exactly
    fp = footprint(layout, Batch.balanced(B, s, T), model, T, page)
    w_a = weight_report(model, T).model_bytes
    expect = eq1_footprint(layout, w_a, model.kv_bytes_per_token, B, s, T)
    assert (fp.total == expect).all()
    assert fp.busiest == expect


def test_longest_balanced_context_agrees_with_eq1():
    model = load("model", "deepseek-v3.2")
    T, B, page, budget = 8, 16, 64, 60 * GIB
    w_a = weight_report(model, T).model_bytes
    found = {}
    for layout in LAYOUTS:
        s = longest_balanced_context(layout, model, T, B, budget, page)
        closed = eq1_longest_context(layout, budget, w_a, model.kv_bytes_per_token, B, T)
        assert s <= closed + 1e-6  # pages only ever round up the footprint
        assert closed - s < T * page  # ...by less than one page per rank per request
        fits = lambda n: footprint(layout, Batch.balanced(B, n, T), model, T, page).busiest <= budget
        assert fits(s) and not fits(s + 1)
        found[layout] = s
    # §2: DOP reaches the longest context, then DP and CP (equal), then TP
    assert found[Layout.DOP] > found[Layout.DP] == found[Layout.CP] > found[Layout.TP]


def test_nothing_fits_gives_zero():
    model = load("model", "deepseek-v3")
    assert longest_balanced_context(Layout.DP, model, 8, 4, 1 * GIB, 64) == 0
    assert eq1_longest_context(Layout.DP, 1 * GIB, 20 * GIB, 1000, 4, 8) == 0


def test_unequal_batch_footprint_with_idle_ranks():
    batch = Batch((Request(0, 100, 1), Request(1, 7, 1), Request(2, 0, 2)))
    fp = footprint(Layout.DOP, batch, HYBRID, 4, 4)
    kv_page = 4 * HYBRID.kv_bytes_per_token_layer
    assert HYBRID.layer_kinds == ('kda', 'mla', 'kda')
    assert fp.kv.tolist() == [0, (25 + 2) * kv_page, 0, 0]  # ranks 0 and 3 idle
    # request 2 has no history yet, so no recurrent state either: rank 2 holds nothing
    assert fp.recurrent.tolist() == [0, 2 * HYBRID.recurrent_bytes_per_request, 0, 0]
    tp = footprint(Layout.TP, batch, HYBRID, 4, 4)
    assert (tp.recurrent == 2 * HYBRID.recurrent_bytes_per_request // 4).all()


# ---- loads (Table 2) -----------------------------------------------------------------------

@pytest.mark.parametrize("B", [16, 13])
def test_loads_match_table_2_when_balanced(B):
    model = load("model", "deepseek-v3")
    T, page, s = 8, 64, 4096
    per_request = model.kv_bytes_per_token_layer * model.num_layers * s
    table_2 = {  # (weights share, KV stored, KV read, attention work) in requests, as printed
        Layout.TP: (1 / T, B, B, B / T),
        Layout.CP: (1, B / T, B / T, B / T),
        Layout.DP: (1, math.ceil(B / T), math.ceil(B / T), math.ceil(B / T)),
        Layout.DOP: (1 / T, math.ceil(B / T), math.ceil(B / T), math.ceil(B / T)),
    }
    w_a = weight_report(model, T).model_bytes
    for layout, (w, stored, read, work) in table_2.items():
        peak = loads(layout, Batch.balanced(B, s, T), model, T, page).busiest
        assert peak["weight_bytes"] == w * w_a
        if layout is Layout.CP and B % T:
            # CP balances pages, not requests: the busiest rank holds at most one page more per request
            assert stored * s <= peak["kv_stored_tokens"] <= stored * s + B * page
            assert work * s <= peak["attention_pairs"] <= work * s + B * page
            continue
        assert peak["kv_stored_tokens"] == stored * s
        assert peak["kv_read_bytes"] == read * per_request
        assert peak["attention_pairs"] == pytest.approx(work * s)


def test_cp_attention_pairs_by_brute_force():
    """Chunked prefill under CP: a rank computes the (row, key) pairs whose key it holds."""
    T, page = 3, 4
    batch = Batch((Request(7, 23, 0, query_rows=9), Request(2, 10, 1, query_rows=10),
                   Request(4, 5, 2, query_rows=1), Request(9, 0, 0, query_rows=0)))
    expect = np.zeros(T)
    for req in batch.requests:
        for row in range(req.context - req.query_rows, req.context):
            for key in range(row + 1):
                expect[cp_rank_of_page(req.id, key // page, T)] += 1
    got = loads(Layout.CP, batch, MLA, T, page)
    assert got.attention_pairs.tolist() == expect.tolist()
    assert got.attention_pairs.sum() == causal_pairs(batch.contexts, [9, 10, 1, 0]).sum()
    assert got.query_rows.tolist() == [20] * T


def test_loads_of_unequal_batches_follow_the_blocks():
    T, page = 4, 4
    batch = Batch((Request(3, 30, 1, 2), Request(5, 9, 1), Request(6, 17, 2, 17)))
    for layout in LAYOUTS:
        got = loads(layout, batch, MLA, T, page)
        sets = blocks.block_sets(layout, batch, MLA, T, page, layers=[0])
        contexts = {r.id: r.context for r in batch.requests}
        tokens = [sum(len(blocks.page_positions(b[3], contexts[b[2]], page)) for b in s if b[1] == "kv") for s in sets]
        assert got.kv_stored_tokens.tolist() == tokens
        assert got.kv_read_bytes.tolist() == [
            t * (MLA.kv_bytes_per_token_layer + MLA.indexer_bytes_per_token_layer) * 2 for t in tokens]
        assert got.recurrent_bytes.sum() == 0
        if layout in (Layout.DP, Layout.DOP):
            assert got.query_rows.tolist() == [0, 3, 17, 0]  # rank 0 and 3 idle
            assert got.attention_pairs.tolist() == [0, causal_pairs(30, 2) + 9, causal_pairs(17, 17), 0]
        if layout is Layout.CP:  # a single row on every rank, a chunk's rows where their positions live
            rows = np.zeros(T)
            for r in batch.requests:
                if r.query_rows == 1:
                    rows += 1
                else:
                    for pos in range(r.context - r.query_rows, r.context):
                        rows[cp_rank_of_page(r.id, pos // page, T)] += 1
            assert got.projection_rows.tolist() == rows.tolist() == [5, 5, 8, 5]
        else:
            assert got.projection_rows.tolist() == ([0, 3, 17, 0] if layout is Layout.DP else [20] * T)
        assert got.busiest_rank("kv_stored_tokens") == int(np.argmax(tokens))


def test_cp_prefix_matrix_by_brute_force():
    rng = np.random.default_rng(5)
    for _ in range(100):
        T, P = int(rng.integers(1, 6)), int(rng.choice([1, 2, 4, 8]))
        s, rid = int(rng.integers(0, 60)), int(rng.integers(0, 50))
        x = int(rng.integers(0, s + 1))
        count, possum = cp_prefix_matrix([s], [rid], T, P, upto=[x])
        expect_c, expect_p = np.zeros(T, dtype=int), np.zeros(T, dtype=int)
        for t in range(x):
            r = cp_rank_of_page(rid, t // P, T)
            expect_c[r] += 1
            expect_p[r] += t
        assert count[0].tolist() == expect_c.tolist() and possum[0].tolist() == expect_p.tolist()


# ---- owners -----------------------------------------------------------------------------------

def test_owner_is_the_least_projected_rank():
    assert assign_owner([5, 3, 3, 9]) == 1  # ties go to the lowest rank
    # projected growth (context + tokens still to generate), not request count, decides
    assert assign_owners([1000, 10, 10, 10, 500], 2) == [0, 1, 1, 1, 1]
    assert assign_owners([5, 5], 3, initial=[0, 0, 1]) == [0, 1]
