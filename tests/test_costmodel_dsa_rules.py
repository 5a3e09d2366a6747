"""The cost model prices sparse attention (DeepSeek Sparse Attention) as SPLASH's runtime runs it:
one rule says whether decode steps can be captured (the runtime builds decode graphs only where it
holds; the cost model charges replayed steps, re-capture and graph memory only there), and CP's
global top-k costs an all-gather of every rank's candidates that attention waits for."""

from __future__ import annotations

import numpy as np
import pytest

from splash_core.layouts import LAYOUTS, Layout, Primitive
from splash_core.planning.costmodel import BatchArrays, CostModel
from splash_core.profiles.graphs import decode_capturable
from splash_core.profiles.loader import load
from splash_core.profiles.model import LayerKind

CP = LAYOUTS.index(Layout.CP)


@pytest.fixture(scope="module")
def replaying():
    """H200's θ with a replayed decode step's terms: a backend that captures and replays graphs."""
    return load("hardware", "h200").with_host_overheads(
        {l: 5.0 for l in LAYOUTS}, 0.5, {l: 1.0 for l in LAYOUTS}, 10.0, source="measured", date="2026-12-06",
        machine="made up for a test", command="none", ref="a replaying profile")


def test_one_rule_says_which_decode_steps_are_captured(replaying):
    assert decode_capturable(kda=False) and not decode_capturable(kda=True)
    v32 = load("model", "deepseek-v3.2")
    x = BatchArrays.of([4096] * 8, np.arange(8) % 8)
    sparse = CostModel(v32, replaying, 8, page_size=64)
    dense = CostModel(v32, replaying, 8, page_size=64, sparse=False)
    assert sparse.decode_capturable and dense.decode_capturable  # sparse decode replays its own graphs
    # replayed decode: the replayed t0 and host term, re-capture in a switch, graph memory
    assert sparse.replays and sparse.graph_costs is not None and dense.replays and dense.graph_costs is not None
    assert sparse.evaluate(x).overhead_s == pytest.approx(10e-6) == dense.evaluate(x).overhead_s
    hybrid = CostModel(load("model", "tiny-hybrid"), replaying, 2, page_size=16)
    assert not hybrid.decode_capturable and hybrid.graph_costs is None
    assert hybrid.evaluate(BatchArrays.of([64, 64], [0, 1])).overhead_s == pytest.approx(
        replaying.step_overhead_us.value * 1e-6)  # eager: the eager t0


def test_the_scheduler_says_why_a_kda_model_recaptures_nothing(replaying):
    import dataclasses

    from splash_core.planning.scheduler import Scheduler

    deployment = dataclasses.replace(load("deployment", "dcu-x8-glm-5.3-flash"), hardware=replaying)
    scheduler = Scheduler(deployment)
    x = BatchArrays.of([1000] * 16, np.arange(16) % 8)
    decision = next(d for d in (scheduler.decide(x, layout) for layout in Layout) if d.switch)
    assert scheduler.cost.graph_costs is None
    assert "decode steps run eagerly" in scheduler.explain_switch_cost(decision, scheduler.switch_cost(decision, x), x)


def test_cp_pays_for_the_global_top_k_where_a_context_exceeds_k():
    v32, hw = load("model", "deepseek-v3.2"), load("hardware", "h200-paper")
    cost = CostModel(v32, hw, 8, page_size=64)
    k, layers = v32.indexer.topk, v32.num_layers
    decode = BatchArrays.of([100_000] * 16, np.arange(16) % 8)
    per_layer = 7 * 16 * k * 8  # (T - 1) ranks' [rows, 2k] float32 candidates
    assert cost.cp_candidate_bytes(decode) == per_layer
    with_candidates = cost.evaluate(decode)
    cost.cp_candidate_bytes = lambda *a, **kw: 0.0  # the same model without the exchange
    without = cost.evaluate(decode)
    del cost.cp_candidate_bytes
    gather = cost.bw[Primitive.ALL_GATHER]
    assert with_candidates.comm_s[CP] - without.comm_s[CP] == pytest.approx(layers * per_layer / gather)
    assert with_candidates.exposed_comm_s[CP] - without.exposed_comm_s[CP] == pytest.approx(layers * per_layer / gather)
    assert with_candidates.latency_s[CP] - without.latency_s[CP] == pytest.approx(layers * cost.latency)
    assert with_candidates.scratch_bytes[CP] - without.scratch_bytes[CP] == pytest.approx(np.full(8, per_layer * 8 / 7))
    others = [i for i in range(len(LAYOUTS)) if i != CP]
    np.testing.assert_array_equal(with_candidates.total_s[others], without.total_s[others])
    # nothing to exchange: every context within k, one rank, dense attention
    assert cost.cp_candidate_bytes(BatchArrays.of([k] * 16, np.arange(16) % 8)) == 0.0
    assert CostModel(v32, hw, 1, page_size=64).cp_candidate_bytes(BatchArrays.of([100_000], [0])) == 0.0
    assert CostModel(v32, hw, 8, page_size=64, sparse=False).cp_candidate_bytes(decode) == 0.0
    # a prefill chunk whose rank gathers the history selects alone: only the decode rows exchange
    mixed = BatchArrays.of([32768] + [100_000] * 15, np.arange(16) % 8, query_rows=[16384] + [1] * 15)
    assert cost.cp_candidate_bytes(mixed) == 7 * 15 * k * 8


def test_shared_indexer_layers_pay_no_indexer():
    """GLM-5's shared-indexer layers reuse the previous layer's top-k: no indexer projections,
    scores, key reads or CP candidate exchange of their own."""
    import dataclasses

    glm, hw = load("model", "glm-5.3"), load("hardware", "h200-paper")
    shared = dataclasses.replace(glm, indexer=dataclasses.replace(
        glm.indexer, shared_layers=tuple(range(1, glm.num_layers, 2))))
    full, half = CostModel(glm, hw, 8, page_size=64), CostModel(shared, hw, 8, page_size=64)
    kf, kh = (next(kc for kc in c.kinds if kc.kind is LayerKind.MLA) for c in (full, half))
    assert (kf.index_share, kh.index_share) == (1.0, 0.5)
    assert kh.flops_index_pair == pytest.approx(kf.flops_index_pair / 2) and kh.flops_row_owner < kf.flops_row_owner
    x = BatchArrays.of([100_000] * 16, np.arange(16) % 8)
    a, b = full.evaluate(x), half.evaluate(x)
    assert (b.att_s < a.att_s).all() and (b.proj_s <= a.proj_s).all()
    others = [i for i in range(len(LAYOUTS)) if i != CP]
    np.testing.assert_allclose(a.comm_s[others], b.comm_s[others])
    exchanged = full.cp_candidate_bytes(x) / full.bw[Primitive.ALL_GATHER]
    assert a.comm_s[CP] - b.comm_s[CP] == pytest.approx(glm.num_layers / 2 * exchanged)


def test_no_context_beyond_k_attends_densely_and_scores_nothing():
    """As the runtime: where no context exceeds k every key is selected, so it attends with the
    dense kernels and the indexer scores nothing; one key beyond k and every rank scores."""
    v32, hw = load("model", "deepseek-v3.2"), load("hardware", "h200-paper")
    sparse, dense = CostModel(v32, hw, 8, page_size=64), CostModel(v32, hw, 8, page_size=64, sparse=False)
    k = v32.indexer.topk
    within, beyond = (BatchArrays.of([c] * 16, np.arange(16) % 8) for c in (k, k + 1))
    assert not sparse.scored_pairs(within).any() and sparse.scored_pairs(beyond).all()
    np.testing.assert_allclose(sparse.evaluate(within).att_s, dense.evaluate(within).att_s)
    assert (sparse.evaluate(beyond).att_s > dense.evaluate(beyond).att_s).all()  # scores on top of k keys
    assert not dense.scored_pairs(beyond).any()
