"""The phase-aware cost model: sparse attention, CP as the paper runs it, Eq 6's scratch on
local heads, the shared dense/MoE blocks, and Eq 13-14's transfer law in Eq 7."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from splash_core.layouts import LAYOUTS, Layout
from splash_core.planning.costmodel import BatchArrays, CostModel, rank_loads, switch_cost
from splash_core.planning.ffn_costs import ffn_costs
from splash_core.planning.layer_costs import sparse_pairs
from splash_core.planning.manifest import plan_switch
from splash_core.planning.ownership import Batch, cp_rank_of_page
from splash_core.profiles import load
from splash_core.profiles.model import LayerKind

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP
GIB = float(1 << 30)


@pytest.fixture(scope="module")
def dsv32():
    return load("model", "deepseek-v3.2")


@pytest.fixture(scope="module")
def paper_h200():
    return load("deployment", "h200-x8-deepseek-v3.2")


def test_sparse_pairs_by_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(200):
        s = int(rng.integers(1, 400))
        q = int(rng.integers(0, s + 1))
        k = int(rng.integers(1, 300))
        brute = sum(min(j + 1, k) for j in range(s - q, s))
        assert sparse_pairs([s], [q], k)[0] == brute
        assert sparse_pairs([s], [q], None)[0] == sum(j + 1 for j in range(s - q, s))


def test_cp_rows_remote_tokens_and_sparse_pairs_by_brute_force():
    """A CP rank projects the chunk rows whose positions it holds (a decode row everywhere),
    lacks the rest of a prefilling request's history, and attends to its share of the top-k."""
    T, P, K = 4, 16, 40
    contexts, rows, ids = [200, 37, 90, 5], [64, 1, 90, 1], [3, 7, 10, 2]
    x = BatchArrays.of(contexts, [0, 1, 2, 3], query_rows=rows, ids=ids)
    ld = rank_loads(x, T, P, topk=K).of(CP)
    held = np.zeros((len(ids), T))
    proj, remote = np.zeros(T), np.zeros(T)
    for i, (s, q, rid) in enumerate(zip(contexts, rows, ids)):
        for pos in range(s):
            r = int(cp_rank_of_page(rid, pos // P, T))
            held[i, r] += 1
            if q > 1 and pos >= s - q:
                proj[r] += 1
        if q == 1:
            proj += 1
        else:
            remote += s - held[i]
    np.testing.assert_allclose(ld["proj_rows"], proj)
    np.testing.assert_allclose(ld["remote_tokens"], remote)
    share = sparse_pairs(contexts, rows, K) / np.array(contexts)
    np.testing.assert_allclose(ld["sparse_pairs"], share @ held)
    dense = rank_loads(x, T, P)
    np.testing.assert_allclose(dense.sparse_pairs, dense.pairs)


def test_cp_prefill_is_charged_its_history_not_a_per_row_all_gather(paper_h200, dsv32):
    """16 x 4,096 prefill rows: the old model all-gathered every row's partial outputs (about
    60 GB per layer per rank); CP as the paper runs it gathers the remote history and the rows'
    hidden states."""
    cm = CostModel.from_deployment(paper_h200)
    x = BatchArrays.of([4096] * 16, np.arange(16) % 8, query_rows=[4096] * 16)
    est = cm.evaluate(x)
    gather = paper_h200.hardware.all_gather_gbps.value * 1e9
    old = 7 * 16 * 4096 * 128 * (512 * 2 + 4) / gather * 61
    assert est.comm_s[LAYOUTS.index(CP)] < old / 50
    kc = cm.kinds[0]
    rows = (16 * 4096 - 16 * 4096 / 8) * dsv32.hidden_size * 2  # the rows' hidden states, DP-like
    assert est.comm_s[LAYOUTS.index(CP)] >= 61 * rows / gather
    history = 16 * 4096 * 7 / 8 * kc.stored_bytes_token
    assert est.comm_s[LAYOUTS.index(CP)] <= 61 * (rows + history) / gather * 1.01


def test_scratch_counts_the_heads_a_rank_computes(dsv32):
    """Eq 6's A for 16 x 8,192 prefill rows: TP's rows on its 16 heads are 7.75 GiB (the old
    model charged every head, 37.5 GiB); DP's owner rows carry all heads."""
    hw = load("hardware", "h200-paper")
    cm = CostModel(dsv32, hw, 8, page_size=64)
    x = BatchArrays.of([8192] * 16, np.arange(16) % 8, query_rows=[8192] * 16)
    scratch = cm.evaluate(x).scratch_bytes.max(axis=1)
    d, H, wq, wz = dsv32.hidden_size, 128, 576, 512
    n = 16 * 8192
    assert scratch[LAYOUTS.index(TP)] == pytest.approx(n * (2 * d + H / 8 * (wq + wz)) * 2)
    assert scratch[LAYOUTS.index(TP)] / GIB == pytest.approx(7.75, abs=0.01)
    assert scratch[LAYOUTS.index(DP)] == pytest.approx(n / 8 * (2 * d + H * (wq + wz)) * 2)
    assert scratch[LAYOUTS.index(DOP)] == pytest.approx(scratch[LAYOUTS.index(TP)] + scratch[LAYOUTS.index(DP)]
                                                        - n / 8 * 2 * d * 2)


def test_tp_and_dop_fit_a_prefill_chunk_where_the_paper_ran_them(paper_h200):
    """16 requests prefilling 8,192 rows each at 32K: every layout fits Eq 6 on the paper's group."""
    from splash_core.planning.scheduler import Scheduler

    s = Scheduler(paper_h200)
    x = BatchArrays.of([32768] * 16, np.arange(16) % 8, query_rows=[8192] * 16, reserved=[32768 + 1024] * 16)
    d = s.decide(x, TP)
    assert all(d.fits_steady(l) for l in LAYOUTS)


def test_shared_blocks_cost_every_layout_alike_and_follow_the_routing(dsv32):
    hw = load("hardware", "h200-paper")
    cm = CostModel(dsv32, hw, 8, page_size=64)
    c = ffn_costs(dsv32)
    assert (c.dense_layers, c.moe_layers, c.experts, c.experts_per_row) == (3, 58, 256, 8)
    small = cm.evaluate(BatchArrays.of([4096] * 4, np.arange(4)))
    big = cm.evaluate(BatchArrays.of([4096] * 256, np.arange(256) % 8))
    # decode reads the experts its rows touch: 4 rows touch fewer than 256 rows do
    touched = lambda n: 32 * (1 - (1 - 8 / 256) ** n)  # noqa: E731
    read = lambda n: (touched(n) + 1 / 8) * c.expert_bytes / (hw.weight_read_gbps.value * 1e9)  # noqa: E731
    reduce = lambda n: n * 7168 * 2 / (hw.all_reduce_gbps.value * 1e9) + hw.collective_latency_us.value * 1e-6  # noqa: E731
    assert small.ffn_s == pytest.approx(58 * (read(4) + reduce(4)) + 3 * (max(
        4 * c.dense_flops_row / 8 / (hw.matmul_tflops.value * 1e12), c.dense_bytes / 8 / (hw.weight_read_gbps.value * 1e9))
        + reduce(4)), rel=1e-9)
    assert (big.ffn_s > small.ffn_s).all()
    # the same in every layout (MoE rows all-reduced), so it cancels in Eq 8 but not in throughput ratios
    assert np.ptp(big.ffn_s) == 0 == np.ptp(small.ffn_s)
    plain = CostModel(dataclasses.replace(dsv32, moe=None, intermediate_size=0), hw, 8, page_size=64).evaluate(
        BatchArrays.of([4096] * 256, np.arange(256) % 8))
    np.testing.assert_allclose(big.total_s - plain.total_s, big.ffn_s, rtol=1e-9)
    assert min(big.total_s) / max(big.total_s) > min(plain.total_s) / max(plain.total_s)


def test_transfer_law_scales_the_measured_reference(dsv32):
    """Eq 14: the paper's per-direction reference at B = 16 x 128K, linear in B·s for KV and
    fixed for weights; Eq 7 then exposes the first layer and whatever later layers do not hide."""
    hw = load("hardware", "h200-paper")
    cm = CostModel(dsv32, hw, 8, page_size=64)
    ref = Batch.balanced(16, 131072, 8)
    kv_only = plan_switch(DP, CP, ref, dsv32, 8, 64)
    t = switch_cost(kv_only, cm, cm.step_time(CP, BatchArrays.from_batch(ref)))
    assert t.transfer_s[0] == pytest.approx(3.827e-3)
    double = plan_switch(DP, CP, Batch.balanced(32, 131072, 8), dsv32, 8, 64)
    assert switch_cost(double, cm, cm.step_time(CP, BatchArrays.from_batch(ref))).transfer_s[0] == \
        pytest.approx(2 * 3.827e-3, rel=1e-6)
    both = plan_switch(DOP, CP, Batch.balanced(4, 131072, 8), dsv32, 8, 64)
    dest = cm.step_time(CP, BatchArrays.from_batch(Batch.balanced(4, 131072, 8)))
    cost = switch_cost(both, cm, dest)
    # weights fixed; KV by the busiest rank's bytes: with 4 requests a CP rank receives 4/8 of
    # one history, in the reference 14/8 (16 requests less the two it owns)
    assert cost.transfer_s[0] == pytest.approx(0.633e-3 + 3.887e-3 * 4 / 14, rel=1e-6)
    compute = dest.layer_s[LayerKind.MLA] + dest.ffn_s / 61
    assert cost.exposed_s == pytest.approx(cost.transfer_s[0] + 60 * max(0.0, cost.transfer_s[0] - compute))
    # without references: bytes over the bandwidth plus a latency per collective
    bare = CostModel(dsv32, dataclasses.replace(hw, switch_transfer=None), 8, page_size=64)
    fetched = kv_only.layers[0].states
    expected = sum(float(p.fetched_bytes.max()) / bare.bw[p.primitive] + bare.latency
                   for p in fetched.values() if p.primitive.value != "discard")
    assert switch_cost(kv_only, bare, bare.step_time(CP, BatchArrays.from_batch(ref))).transfer_s[0] == \
        pytest.approx(expected)


def test_dense_attention_is_what_a_deployment_without_top_k_pays(dsv32):
    hw = load("hardware", "h200-paper")
    x = BatchArrays.of([131072] * 16, np.arange(16) % 8)
    sparse = CostModel(dsv32, hw, 8, page_size=64).evaluate(x)
    dense = CostModel(dsv32, hw, 8, page_size=64, sparse=False).evaluate(x)
    assert (sparse.att_s < dense.att_s).all()  # 2,048 keys per row instead of 128K
    # the cache is the same; CP's scratch also holds the top-k candidates of every rank
    np.testing.assert_allclose(sparse.memory_bytes - sparse.scratch_bytes, dense.memory_bytes - dense.scratch_bytes)


def test_decode_choice_follows_the_load_on_the_papers_group(paper_h200):
    """Without the measured T = 2 runtime's host overheads (1.3-2.2 ms per layer, which made DP
    win every decode), the paper's H200 group decodes a few short requests in TP, and long
    histories that TP cannot hold in a layout that can."""
    from splash_core.planning.scheduler import Scheduler

    s = Scheduler(paper_h200)
    few = s.decide(BatchArrays.of([1024] * 4, np.arange(4)), DP)
    assert few.layout is TP and few.action == "switch"
    long = s.decide(BatchArrays.of([131072] * 16, np.arange(16) % 8), DP)
    assert not long.fits_steady(TP) and long.layout is not TP


def test_prefill_attention_is_priced_in_the_form_the_runtime_runs():
    """A fresh 8K prompt attends expanded (auto): TP, DP and CP attention costs its work (about 0.4x
    the absorbed form's at DeepSeek-V3's widths); DOP, decode steps and `absorbed` keep the absorbed
    price."""
    dep = dataclasses.replace(load("deployment", "h200-x2-deepseek-v3"), T=2)
    auto = CostModel.from_deployment(dep)
    absorbed = CostModel.from_deployment(dataclasses.replace(dep, prefill_attention="absorbed"))
    fresh = BatchArrays.of([8192, 8192], [0, 1], query_rows=[8192, 8192])
    a, b = auto.evaluate(fresh).att_s, absorbed.evaluate(fresh).att_s
    dop = LAYOUTS.index(Layout.DOP)
    assert a[dop] == b[dop]
    for layout in (Layout.TP, Layout.DP, Layout.CP):
        i = LAYOUTS.index(layout)
        assert 0.3 * b[i] < a[i] < 0.5 * b[i], layout
    decode = BatchArrays.of([8192, 8192], [0, 1])
    np.testing.assert_array_equal(auto.evaluate(decode).total_s, absorbed.evaluate(decode).total_s)
    # a short chunk after a long history stays absorbed
    late = BatchArrays.of([65536, 65536], [0, 1], query_rows=[16, 16])
    np.testing.assert_array_equal(auto.evaluate(late).total_s, absorbed.evaluate(late).total_s)
