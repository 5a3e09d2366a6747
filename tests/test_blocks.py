"""Block sets per rank and layout follow the placement rules and add up to the footprints."""

from __future__ import annotations

from collections import Counter

import blocks
import numpy as np
import pytest
from test_manifest import HYBRID, MLA

from splash_core.layouts import LAYOUTS, Layout, State
from splash_core.planning.ownership import (Batch, Request, cp_pages_per_rank, cp_tokens_per_rank, footprint,
                                            kv_pages_per_rank, kv_tokens_per_rank)
from splash_core.profiles.projections import projections

PAGE = 4
BATCH = Batch((Request(11, 37, 2), Request(5, 4, 0), Request(8, 0, 1), Request(2, 9, 2)))  # rank 3 owns nothing


def kv_pages(block_set, layer=0, state="kv"):
    return {(b[2], b[3]) for b in block_set if len(b) == 4 and b[0] == layer and b[1] == state}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_position_is_held_as_the_layout_says(layout):
    T = 4
    sets = blocks.block_sets(layout, BATCH, MLA, T, PAGE)
    for req in BATCH.requests:
        holders = Counter()
        for r, s in enumerate(sets):
            for rid, page in kv_pages(s):
                if rid == req.id:
                    for pos in blocks.page_positions(page, req.context, PAGE):
                        holders[pos] += 1
                        if layout.ownership.value == "owner":
                            assert r == req.owner
        copies = T if layout is Layout.TP else 1
        assert holders == Counter({pos: copies for pos in range(req.context)})
        # the indexer follows the kv pages exactly
        for s in sets:
            assert kv_pages(s, state="indexer") == kv_pages(s)


def test_cp_pages_and_tokens_match_the_ownership_model():
    T = 3
    sets = blocks.block_sets(Layout.CP, BATCH, MLA, T, PAGE)
    for req in BATCH.requests:
        pages = [sum(1 for rid, _ in kv_pages(s) if rid == req.id) for s in sets]
        tokens = [sum(len(blocks.page_positions(p, req.context, PAGE)) for rid, p in kv_pages(s) if rid == req.id)
                  for s in sets]
        assert pages == cp_pages_per_rank(req.context, req.id, T, PAGE).tolist()
        assert tokens == cp_tokens_per_rank(req.context, req.id, T, PAGE).tolist()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_and_tokens_per_rank(layout):
    T = 4
    sets = blocks.block_sets(layout, BATCH, MLA, T, PAGE)
    contexts = {r.id: r.context for r in BATCH.requests}
    assert kv_pages_per_rank(layout, BATCH, T, PAGE).tolist() == [len(kv_pages(s)) for s in sets]
    assert kv_tokens_per_rank(layout, BATCH, T, PAGE).tolist() == [
        sum(len(blocks.page_positions(p, contexts[rid], PAGE)) for rid, p in kv_pages(s)) for s in sets]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weights_and_recurrent_shards(layout):
    T = 3
    sets = blocks.block_sets(layout, BATCH, HYBRID, T, PAGE)
    names = {kind: [p.name for p in projections(HYBRID, kind)] for kind in set(HYBRID.layer_kinds)}
    for r, s in enumerate(sets):
        for layer, kind in enumerate(HYBRID.layer_kinds):
            shards = {(b[1], b[2]) for b in s if len(b) == 3 and b[0] == layer}
            expect_shards = [r] if layout.placement.value == "sharded" else range(T)
            assert shards == {(m, k) for m in names[kind] for k in expect_shards}
            rec = {(b[2], b[3]) for b in s if b[0] == layer and blocks.state_of(b) is State.RECURRENT}
            if kind.value == "mla":
                assert not rec
            elif layout is Layout.TP:  # request 8 has no history yet, so no state
                assert rec == {(req.id, r) for req in BATCH.requests if req.context}
            else:
                assert rec == {(req.id, k) for req in BATCH.requests if req.owner == r and req.context
                               for k in range(T)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model", [MLA, HYBRID], ids=["mla+indexer", "kda+mla"])
def test_block_bytes_add_up_to_the_footprint(layout, model):
    T = 3
    fp = footprint(layout, BATCH, model, T, PAGE)
    for r, s in enumerate(blocks.block_sets(layout, BATCH, model, T, PAGE)):
        by_state = Counter()
        for b in s:
            by_state[blocks.state_of(b)] += blocks.block_bytes(b, model, T, PAGE)
        assert by_state[State.WEIGHTS] == fp.weights[r]
        assert by_state[State.KV] == fp.kv[r]
        assert by_state[State.INDEXER] == fp.indexer[r]
        assert by_state[State.RECURRENT] == fp.recurrent[r]


def test_page_positions_cover_the_last_partial_page():
    assert blocks.page_positions(2, 10, 4) == range(8, 10)
    assert blocks.page_positions(0, 3, 4) == range(0, 3)
    assert blocks.state_of((0, "q_b", 1)) is State.WEIGHTS
    assert blocks.state_of((0, "indexer", 7, 1)) is State.INDEXER


def test_kv_page_bytes_are_whole_pages():
    # a page moves and is stored whole, however many of its positions are written
    assert blocks.block_bytes((0, "kv", 5, 0), MLA, 2, PAGE) == PAGE * MLA.kv_bytes_per_token_layer
    assert MLA.kv_bytes_per_token_layer == 8 * 2 + 4 * 2 + 2
    assert np.all(footprint(Layout.TP, Batch((Request(0, 1, 0),)), MLA, 2, PAGE).kv
                  == 2 * PAGE * MLA.kv_bytes_per_token_layer)
