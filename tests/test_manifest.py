"""The switch planner against the one-block-at-a-time oracle of blocks.

For random batches (unequal contexts, arbitrary request ids, idle ranks), every group size
in {1, 2, 3, 4, 8} and all 12 directions: applying a manifest to the source block sets gives
exactly the destination block sets on every rank, every fetched block comes from a rank
that holds it, the bytes are the set differences, and the send matrix is the transpose of
the receive matrix. The primitives are checked against the paper's Figure 3 (right).
"""

from __future__ import annotations

import blocks
import numpy as np
import pytest

from splash_core.layouts import DIRECTIONS, LAYOUTS, Layout, Primitive, State
from splash_core.planning.manifest import plan_switch
from splash_core.planning.manifest.diff import BlockDiff
from splash_core.planning.manifest.universe import Universe, rank_bits
from splash_core.planning.ownership import Batch, Request, footprint
from splash_core.profiles import load
from splash_core.profiles.model import LayerKind

PAGE = 4


def tiny_model(pattern=("mla",), layers=2, heads=24, indexer=True):
    """A small model whose head counts divide every T tested (24 = 1·2·3·4·8·...)."""
    data = {
        "name": "tiny-test", "hidden_size": 32, "layers": {"count": layers, "pattern": list(pattern)},
        "mla": {"heads": heads, "q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
                "qk_rope_head_dim": 4, "v_head_dim": 4},
        "kda": {"heads": heads, "head_dim": 4, "conv_size": 3, "state_dtype": "fp32"},
        "kv_cache": {"latent_dtype": "bf16", "rope_dtype": "bf16", "scale_bytes": 2},
        "weight_dtype": "bf16",
    }
    if indexer:
        data["indexer"] = {"heads": 2, "head_dim": 4, "topk": 8, "dtype": "fp8", "scale_bytes": 4}
    return load("model", data)


MLA = tiny_model()
HYBRID = tiny_model(pattern=("kda", "mla"), layers=3, indexer=False)


def random_batch(rng, T, max_requests=6, max_context=40):
    n = int(rng.integers(0, max_requests + 1))
    ids = rng.choice(1000, size=n, replace=False)
    # owners drawn from a subset of ranks so some ranks own nothing
    owner_pool = rng.choice(T, size=max(1, T // 2), replace=False)
    return Batch(tuple(
        Request(int(i), int(rng.integers(0, max_context + 1)), int(rng.choice(owner_pool)))
        for i in ids
    ))


def as_ids(plan, layer, keys):
    """Manifest keys of one state of one layer as blocks ids."""
    if plan.state is State.WEIGHTS:
        return [(layer, plan.matrices[int(m)], int(s)) for m, s in keys]
    return [(layer, str(plan.state), int(a), int(b)) for a, b in keys]


def check_manifest(man, batch, model, T):
    """Every invariant of one manifest, against the explicit block sets."""
    src_sets = blocks.block_sets(man.src, batch, model, T, PAGE)
    dst_sets = blocks.block_sets(man.dst, batch, model, T, PAGE)
    assert set().union(*src_sets) == set().union(*dst_sets)  # no block lost, none invented
    size = lambda ids: sum(blocks.block_bytes(b, model, T, PAGE) for b in ids)
    applied = [set() for _ in range(T)]
    for layer in man.layers:
        for state, plan in layer.states.items():
            in_state = lambda b: b[0] == layer.index and blocks.state_of(b) is state
            fetched_anywhere, lands_everywhere = False, True
            for r in range(T):
                rb = plan.rank(r)
                kept, freed, fetched = (as_ids(plan, layer.index, k) for k in (rb.kept, rb.freed, rb.fetched))
                for ids in (kept, freed, fetched):
                    assert len(ids) == len(set(ids)), "a block listed twice"
                src_r = {b for b in src_sets[r] if in_state(b)}
                dst_r = {b for b in dst_sets[r] if in_state(b)}
                assert set(kept) == src_r & dst_r
                assert set(freed) == src_r - dst_r
                assert set(fetched) == dst_r - src_r
                assert (src_r - set(freed)) | set(fetched) == dst_r
                applied[r] |= (src_r - set(freed)) | set(fetched)
                for block, source in zip(fetched, rb.sources):
                    assert source != r and block in src_sets[source], "fetched from a rank that lacks it"
                # what r receives from each source is exactly what that source sends to r, in order
                for s in range(T):
                    expect = rb.fetched[rb.sources == s]
                    assert np.array_equal(plan.rank(s).sends[r], expect)
                # grouped by source in rank order, so recv_splits are all-to-all receive splits
                assert (np.diff(rb.sources) >= 0).all()
                assert np.array_equal(rb.recv_splits, [np.count_nonzero(rb.sources == s) for s in range(T)])
                assert rb.send_splits[r] == 0
                assert plan.kept_bytes[r] == size(kept)
                assert plan.freed_bytes[r] == size(freed)
                assert plan.fetched_bytes[r] == size(dst_r - src_r)
                for s in range(T):
                    from_s = [b for b, src in zip(fetched, rb.sources) if src == s]
                    assert plan.recv_matrix[r, s] == size(from_s)
                fetched_anywhere |= bool(fetched)
                lands_everywhere &= all(all(b in d for d in dst_sets) for b in fetched)
            assert np.array_equal(plan.send_matrix, plan.recv_matrix.T)
            assert np.array_equal(plan.sent_bytes, plan.recv_matrix.sum(axis=0))
            expect = (Primitive.DISCARD if not fetched_anywhere
                      else Primitive.ALL_GATHER if lands_everywhere else Primitive.ALL_TO_ALL)
            assert plan.primitive is expect
    assert applied == dst_sets
    # the manifest's footprints are the ownership model's and the blocks' (page-granular)
    assert np.array_equal(man.source.total, [size(s) for s in src_sets])
    assert np.array_equal(man.dest.total, [size(s) for s in dst_sets])
    assert np.array_equal(sum(l.source_bytes for l in man.layers), man.source.total)
    assert np.array_equal(sum(l.dest_bytes for l in man.layers), man.dest.total)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("model", [MLA, HYBRID], ids=["mla+indexer", "kda+mla"])
def test_every_direction_applies_exactly(T, model):
    rng = np.random.default_rng(1000 + T)
    for _ in range(3):
        batch = random_batch(rng, T)
        for src, dst in DIRECTIONS:
            check_manifest(plan_switch(src, dst, batch, model, T, PAGE), batch, model, T)


def test_more_than_sixteen_ranks():
    """Wide masks take the general single-holder path."""
    rng = np.random.default_rng(7)
    batch = random_batch(rng, 24, max_requests=4, max_context=30)
    for src, dst in [(Layout.CP, Layout.DP), (Layout.DP, Layout.TP), (Layout.TP, Layout.CP)]:
        check_manifest(plan_switch(src, dst, batch, MLA, 24, PAGE), batch, MLA, 24)


def test_same_layout_keeps_everything():
    batch = Batch.balanced(5, 30, 4)
    for layout in LAYOUTS:
        man = plan_switch(layout, layout, batch, HYBRID, 4, PAGE)
        assert man.fetched_bytes().sum() == 0
        for layer in man.layers:
            for plan in layer.states.values():
                assert plan.primitive is Primitive.DISCARD
                assert plan.freed_bytes.sum() == 0


# The paper's Figure 3 (right), typed in from the figure as an independent oracle.
AG, A2A, DISCARD = Primitive.ALL_GATHER, Primitive.ALL_TO_ALL, Primitive.DISCARD
FIGURE_3_WEIGHTS = {("TP", "CP"): AG, ("TP", "DP"): AG, ("DOP", "CP"): AG, ("DOP", "DP"): AG}
FIGURE_3_KV = {("CP", "TP"): AG, ("DP", "TP"): AG, ("DOP", "TP"): AG,
               ("CP", "DP"): A2A, ("CP", "DOP"): A2A, ("DP", "CP"): A2A, ("DOP", "CP"): A2A}


@pytest.mark.parametrize("T", [2, 4, 8])
def test_primitives_match_figure_3(T):
    batch = Batch.balanced(2 * T, 4 * T * PAGE, T)
    for src, dst in DIRECTIONS:
        layer = plan_switch(src, dst, batch, MLA, T, PAGE).layers[0]
        key = (src.value, dst.value)
        assert layer.states[State.WEIGHTS].primitive is FIGURE_3_WEIGHTS.get(key, DISCARD), key
        assert layer.states[State.KV].primitive is FIGURE_3_KV.get(key, DISCARD), key
        assert layer.states[State.INDEXER].primitive is FIGURE_3_KV.get(key, DISCARD), key


def test_primitives_on_a_shipped_model():
    model = load("model", "deepseek-v3.2")
    batch = Batch.balanced(16, 8192, 8)
    for src, dst in DIRECTIONS:
        man = plan_switch(src, dst, batch, model, 8, 64, layers=[0, 1])
        key = (src.value, dst.value)
        assert man.layers[1].states[State.WEIGHTS].primitive is FIGURE_3_WEIGHTS.get(key, DISCARD)
        assert man.layers[1].states[State.KV].primitive is FIGURE_3_KV.get(key, DISCARD)


def test_weight_volume_is_the_unheld_shards():
    """A sharded→replicated switch receives (1 − 1/T) of each layer's projections per rank."""
    model = load("model", "deepseek-v3")
    man = plan_switch(Layout.TP, Layout.CP, Batch.balanced(8, 1024, 8), model, 8, 64)
    per_layer = man.layers[0].states[State.WEIGHTS].fetched_bytes
    assert (per_layer == 287 * (1 << 20)).all()
    assert man.fetched_bytes(State.WEIGHTS).sum() == 61 * 2296 * (1 << 20)


def test_kv_volume_dop_to_cp_matches_page_rotation():
    """DOP→CP at B = 16, 128K, T = 8: every rank receives 14 of the 16 × 256 pages it holds
    under CP from their owners (page 64), the volume hardware/h200-paper.yaml derives its
    all-to-all bandwidth from."""
    model = load("model", "deepseek-v3.2")
    man = plan_switch(Layout.DOP, Layout.CP, Batch.balanced(16, 131072, 8), model, 8, 64, layers=[0])
    kv = man.layers[0].states[State.KV].fetched_bytes
    assert (kv == 14 * 16384 * 656).all()


def test_eq5_peak_and_fits():
    batch = Batch((Request(3, 70, 0), Request(9, 13, 1), Request(4, 0, 0)))
    man = plan_switch(Layout.DP, Layout.TP, batch, MLA, 3, PAGE)
    transit = []
    for layer in man.layers:  # one layer's receive buffers + packed send buffers, per rank
        t = np.zeros(3, dtype=np.int64)
        for plan in layer.states.values():
            t += plan.fetched_bytes
            per_peer = plan.send_matrix
            t += per_peer.max(axis=1) if plan.primitive is Primitive.ALL_GATHER else per_peer.sum(axis=1)
        transit.append(t)
    delta = np.max(transit, axis=0)
    assert np.array_equal(man.delta_layer, delta)
    expect = np.maximum(man.source.total, man.dest.total) + delta
    assert np.array_equal(man.eq5_peak, expect)
    assert np.array_equal(man.peak, expect)  # all layers alike: the sweep never exceeds Eq 5
    need = int(expect.max())
    assert man.fits(need + 100, reserve_bytes=100).fits
    fit = man.fits(need + 99, reserve_bytes=100)
    assert not fit.fits and fit.busiest_rank == int(np.argmax(expect))
    assert "does not fit" in fit.explain() and f"rank {fit.busiest_rank}" in fit.explain()


def test_sweep_peak_is_the_layer_by_layer_maximum():
    rng = np.random.default_rng(3)
    batch = random_batch(rng, 4, max_requests=8)
    for src, dst in DIRECTIONS:
        man = plan_switch(src, dst, batch, HYBRID, 4, PAGE)
        layers = man.layers
        worst = np.zeros(4, dtype=np.int64)
        for i in range(len(layers)):
            mem = sum((l.dest_bytes for l in layers[:i]), np.zeros(4, dtype=np.int64))
            mem = mem + sum(l.source_bytes for l in layers[i:]) + layers[i].transit_bytes
            worst = np.maximum(worst, mem)
        assert np.array_equal(man.sweep_peak, worst)
        assert np.array_equal(man.peak, np.maximum(worst, man.eq5_peak))


def test_layer_subset_restricts_everything():
    batch = Batch.balanced(4, 33, 2)
    man = plan_switch(Layout.TP, Layout.DP, batch, HYBRID, 2, PAGE, layers=[2, 0])
    assert [l.index for l in man.layers] == [0, 2]
    assert [l.kind for l in man.layers] == [LayerKind.KDA, LayerKind.KDA]
    assert np.array_equal(man.source.total, footprint(Layout.TP, batch, HYBRID, 2, PAGE, layers=[0, 2]).total)
    # layers of one kind share one plan
    assert man.layers[0].states is man.layers[1].states
    assert man.layer(2) is man.layers[1]
    with pytest.raises(KeyError, match="layer 1"):
        man.layer(1)


def test_bad_input_is_refused():
    batch = Batch.balanced(4, 10, 4)
    with pytest.raises(ValueError, match="does not divide"):
        plan_switch(Layout.TP, Layout.DP, batch, load("model", "tiny-mla"), 8, PAGE)
    with pytest.raises(ValueError, match="owner 5"):
        plan_switch(Layout.TP, Layout.DP, Batch((Request(0, 5, 5),)), MLA, 4, PAGE)
    with pytest.raises(ValueError, match="unique"):
        plan_switch(Layout.TP, Layout.DP, Batch((Request(0, 5, 0), Request(0, 6, 1))), MLA, 4, PAGE)
    with pytest.raises(ValueError, match="layer 7"):
        plan_switch(Layout.TP, Layout.DP, batch, MLA, 4, PAGE, layers=[7])
    with pytest.raises(ValueError, match="1..64"):
        plan_switch(Layout.TP, Layout.DP, Batch(()), MLA, 96, PAGE)


def test_several_holders_are_chosen_deterministically_and_spread():
    """No layout pair needs it today, but the planner must handle blocks held by several
    ranks: each fetch picks one holder, the same one every time, and load spreads."""
    T = 4
    universe = Universe(np.stack([np.arange(40), np.zeros(40, dtype=np.int64)], axis=1), None, 1)
    src = np.full(40, rank_bits(0, T) | rank_bits(1, T) | rank_bits(2, T))  # ranks 0-2 hold all
    dst = np.full(40, rank_bits(3, T))  # rank 3 needs all
    diff = BlockDiff(universe, src, dst, T)
    rb = diff.rank(3)
    assert len(rb.fetched) == 40 and set(rb.sources.tolist()) == {0, 1, 2}
    assert max(np.bincount(rb.sources)) - min(np.bincount(rb.sources)) <= 1
    assert diff.recv[0, 3].tolist() == np.bincount(rb.sources, minlength=T).tolist()
    again = BlockDiff(universe, src, dst, T).rank(3)
    assert np.array_equal(again.fetched, rb.fetched) and np.array_equal(again.sources, rb.sources)
    for s in range(3):
        assert np.array_equal(diff.rank(s).sends[3], rb.fetched[rb.sources == s])
        assert diff.freed[0, s] == 40 and diff.kept[0, s] == 0


def test_eq5_fit_refuses_nan_inf_and_over_budget_peaks():
    """Eq 5's one verdict (planning/manifest/fit.py): a peak within the budget fits; a planted
    NaN, inf or one byte over refuses, naming the rank; an empty group is an error, not a fit."""
    from splash_core.planning.manifest import eq5_fit, switch_peak

    peak = np.array([100.0, 90.0])
    ok = eq5_fit(peak, budget_bytes=110.0, reserve_bytes=10.0)
    assert ok.fits and ok.refusal() is None
    for planted, rank in ((np.nan, 0), (np.inf, 1), (101.0, 0)):
        bad = peak.copy()
        bad[rank] = planted
        fit = eq5_fit(bad, budget_bytes=110.0, reserve_bytes=10.0)
        assert not fit.fits and f"Eq 5: rank {rank} would peak" in fit.refusal()
    with pytest.raises(ValueError):
        eq5_fit(np.zeros(0), budget_bytes=1.0)
    # one layer moving at a time: [source, dest, transit] per layer -> the layer-by-layer peak
    source, dest, transit = (np.array([[4], [1]]), np.array([[1], [4]]), np.array([[2], [2]]))
    assert switch_peak(source, dest, transit).tolist() == [7]  # max(5, 5) + 2
