"""Shape buckets of the SDPA expanded provider (:mod:`splash_core.kernels.expanded_buckets`): the
bucketed calls compute the same attention as the reference (torch's math algorithm on CPU, the
same planning, padding and merges that run cuDNN on a GPU), a simulated rollout builds few shapes,
all of them in the warm-up's set, and the runtime's passes are cut where the buckets stay exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_sdpa_expanded_provider import Spy, ragged_case
from torch.nn.attention import SDPBackend

from splash_core.kernels import expanded_sdpa
from splash_core.kernels.expanded_buckets import BucketSizes, binary_batches, bucket, deployment_shapes
from splash_core.kernels.expanded_plan import HostIndex, plan
from splash_core.kernels.expanded_sdpa import SdpaExpanded, make_plan, math_attend, sdpa_expanded_attention
from splash_core.reference.expanded import expanded_attention as reference
from splash_core.runtime.expanded_attention import pass_bounds
from splash_core.testing.test_mla_kernels import _assert_matches

DIMS = (16, 8, 16)  # d_n, d_r, d_v
# Per request: (key positions, row positions). Odd history (29: pieces and a remainder), history a
# multiple of G (r = 0 at G 8 and 16), a chunk shorter than G, one row after 49 keys, a row that
# sees nothing, and three requests of equal shape (a batch of 3 = 2 + 1).
REQUESTS = [(range(37), range(29, 37)), (range(24), range(16, 24)), (range(3), range(3)), (range(50), [49]),
            (range(10, 20), [3])] + [(range(21), range(13, 21))] * 3
SIZES = [BucketSizes(4, 1, 2), BucketSizes(8, 2, 8), BucketSizes(16, 4, 4), BucketSizes(64, 64, 64)]


def make_case(requests=REQUESTS, heads=3, seed=0):
    d_n, d_r, d_v = DIMS
    g = torch.Generator().manual_seed(seed)
    starts, k_pos, rows = [0], [], []
    for r, (keys, positions) in enumerate(requests):
        k_pos += list(keys)
        starts.append(len(k_pos))
        rows += [(r, p) for p in positions]
    rows = [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]
    kvb = torch.randn(len(k_pos), heads, d_n + d_v, generator=g)
    i32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    q, k_rope = torch.randn(len(rows), heads, d_n + d_r, generator=g), torch.randn(len(k_pos), d_r, generator=g)
    return (q, kvb[..., :d_n], k_rope, kvb[..., d_n:], i32([r for r, _ in rows]), i32([p for _, p in rows]),
            i32(starts), i32(k_pos), (d_n + d_r) ** -0.5)


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: f"G{s.granularity}-min{s.smallest_rows}-step{s.row_step}")
def test_bucketed_calls_equal_the_reference(sizes):
    spy = Spy()
    for case in (make_case(), ragged_case()):
        _assert_matches(sdpa_expanded_attention(SDPBackend.MATH, spy, buckets=sizes)(*case), reference(*case),
                        torch.float32, f"buckets {sizes}")
    assert spy.rows == []


def test_passes_holding_part_of_a_chunk_stay_exact():
    """A pass's rows that see its keys as history alone, a remainder included (the exact call)."""
    runs = [range(0, 6), range(4, 8), range(6, 12), range(0, 3)]
    rows = [range(12)] * 3 + [range(3, 12)]
    case = make_case(list(zip(runs, rows)), seed=5)
    got = sdpa_expanded_attention(SDPBackend.MATH, reference, buckets=BucketSizes(4, 1, 2))(*case)
    _assert_matches(got, reference(*case), torch.float32, "passes")


def test_bucket_geometry():
    sizes = BucketSizes(8, 2, 8)
    assert [sizes.rows(n) for n in (1, 2, 3, 8, 9, 17)] == [2, 2, 4, 8, 16, 24]
    assert sizes.ladder(17) == [2, 4, 8, 16, 24] and sizes.history_pieces(29) == ([16, 8], 5)
    assert binary_batches(7) == [(0, 4), (4, 2), (6, 1)] and binary_batches(0) == []
    p = plan(np.zeros(8, int), np.arange(29, 37), np.array([0, 37]), np.arange(37))
    (g,) = bucket(p, sizes).groups
    history, more, chunk = g.calls
    assert [(c.keys.shape[1], c.front, c.q_len, c.k_len, c.causal) for c in g.calls] == [
        (16, 0, 8, 16, False), (8, 0, 8, 8, False), (13, 5, 16, 16, True)]
    assert chunk.keys[0].tolist() == list(range(24, 37))  # the history's last 5 keys, then the chunk's
    for bad in ({"granularity": 12}, {"smallest_rows": 0}, {"row_step": 3}, {"smallest_rows": 8, "row_step": 4}):
        with pytest.raises(ValueError, match="BucketSizes"):
            BucketSizes(**bad)


@pytest.mark.parametrize("fault", ["nan", "inf", "empty", "no-remainder"])
def test_the_check_fails_on_planted_faults(fault, monkeypatch):
    case = list(make_case())
    if fault in ("nan", "inf"):
        case[0] = case[0].clone()
        case[0][2, 1, 0] = float(fault)
    elif fault == "empty":  # zero rows, zero requests
        case[0], case[4], case[5], case[6] = case[0][:0], case[4][:0], case[5][:0], case[6][:1]
    else:  # a bucketing that drops the history's remainder keys from the chunk call
        from splash_core.kernels import expanded_buckets

        real = expanded_buckets.BucketCall
        monkeypatch.setattr(expanded_buckets, "BucketCall", lambda keys, front, *rest: real(
            keys[:, front:], 0, *rest) if rest[-1] else real(keys, front, *rest))
    got = sdpa_expanded_attention(SDPBackend.MATH, reference, buckets=BucketSizes(8, 2, 8))(*case)
    with pytest.raises(AssertionError):
        _assert_matches(got, reference(*case), torch.float32, "buckets")


def test_host_index_plans_without_touching_the_device_tensors(monkeypatch):
    """With a host index the provider plans from host arrays (no device-to-host copy) once for
    every call with that index, and gives the same answer."""
    case = make_case()
    host = HostIndex(*(t.numpy() for t in case[4:8]))
    provider = sdpa_expanded_attention(SDPBackend.MATH, reference, buckets=BucketSizes(8, 2, 8))
    planned = []
    monkeypatch.setattr(expanded_sdpa, "host_plan", lambda *a, **k: pytest.fail("planned from device tensors"))
    monkeypatch.setattr(expanded_sdpa, "make_plan", lambda *a, **k: planned.append(1) or make_plan(*a, **k))
    for _ in range(3):  # three layers
        _assert_matches(provider(*case, host=host), reference(*case), torch.float32, "host index")
    assert planned == [1]


def rollout(prompts, chunk: int, page: int = 64, width: int = 16384, sizes: BucketSizes = BucketSizes()):
    """Replay prefill of ``prompts`` in chunks of ``chunk`` rows (requests in order, as the
    engine's controller fills a step) through the runtime's passes of ``width`` keys and the
    bucketed plan: (shapes, computed pairs, visible pairs)."""
    fed, shapes, computed, visible = np.zeros(len(prompts), dtype=np.int64), set(), 0, 0
    while (fed < prompts).any():
        budget, pieces = chunk, []
        for i in np.flatnonzero(fed < prompts):
            take = min(budget, int(prompts[i] - fed[i]))
            if take == 0:
                break
            pieces.append((int(fed[i]), take))
            fed[i] += take
            budget -= take
        q_req = np.concatenate([np.full(n, r) for r, (_, n) in enumerate(pieces)])
        q_pos = np.concatenate([np.arange(h, h + n) for h, n in pieces])
        keys = [-(-(h + n) // page) * page for h, n in pieces]  # whole pages to the last row's
        starts = np.concatenate([[0], np.cumsum(keys)])
        k_pos = np.concatenate([np.arange(k) for k in keys])
        visible += sum(n * h + n * (n + 1) // 2 for h, n in pieces)
        for a, b in pass_bounds(starts, width):
            p = make_plan(q_req, q_pos, np.clip(starts, a, b) - a, k_pos[a:b], buckets=sizes)
            shapes |= p.shapes()
            computed += sum(c.pairs() for g in p.groups for c in g.calls)
    return shapes, computed, visible


@pytest.mark.parametrize("workload", ["96 x 1K-32K", "rollout-h200x2"])
def test_a_rollout_builds_few_shapes_all_warmed_up(workload):
    """Prefill in 8,192-row chunks through 16K-key passes (128 heads in bf16 at 1 GiB a pass): every
    bucketed call shape is one the warm-up runs, and few. Seen: 105 shapes (warm-up 110) against
    532 exact ones over 205 prefill steps, 5.8% extra work, for 96 prompts of 1K-32K; 35 (warm-up
    70) against 140 over 39 steps, 13.9% extra, for rollout-h200x2's 64 prompts of 2K-8K."""
    from splash_core.profiles import load

    if workload == "rollout-h200x2":
        prompts, most, extra = np.array([r.prompt_tokens for r in load("workload", workload).requests()]), 40, 0.15
    else:
        prompts, most, extra = np.random.default_rng(0).integers(1024, 32768, 96, endpoint=True), 110, 0.07
    context = int(prompts.max())
    shapes, computed, visible = rollout(prompts, 8192)
    assert shapes <= set(deployment_shapes(BucketSizes(), 8192, context)) and len(shapes) <= most
    assert visible <= computed <= (1 + extra) * visible  # the padding's extra work


def test_passes_cut_at_request_starts_or_aligned_offsets():
    starts = np.array([0, 5000, 5000, 30000, 31000])
    bounds = pass_bounds(starts, 16384, align=4096)
    assert bounds == [(0, 13192), (13192, 29576), (29576, 31000)]  # 5000 + 2 and + 6 times 4096
    assert bounds[0][0] == 0 and bounds[-1][1] == 31000 and all(b - a <= 16384 for a, b in bounds)
    assert all(a == b2 for (_, b2), (a, _) in zip(bounds, bounds[1:]))
    for cut in [b for _, b in bounds[:-1]]:
        first = starts[np.searchsorted(starts, cut, side="right") - 1]
        assert (cut - first) % 4096 == 0
    assert pass_bounds(np.array([0, 12]), 5) == [(0, 5), (5, 10), (10, 12)]  # narrower than align: any cut


def test_warm_up_runs_every_deployment_shape_with_the_real_calls_strides():
    """The warm-up's tensors have the shapes and strides of the bucketed calls a request makes."""
    seen = {"warm": set(), "real": set()}
    phase = ["warm"]

    def recording(q, k, v, causal, scale):
        seen[phase[0]].add(tuple((t.shape, t.stride()) for t in (q, k, v)) + (causal,))
        return math_attend(q, k, v, causal, scale)

    sizes = BucketSizes(8, 2, 8)
    provider = SdpaExpanded(recording, reference, True, sizes)
    shapes = deployment_shapes(sizes, 16, 64, 2)
    assert provider.warm_up(3, DIMS, torch.float32, torch.device("cpu"), 16, 64, max_batch=2) == len(shapes)
    assert {(s[0][0][0], s[0][0][2], s[1][0][2], s[-1]) for s in seen["warm"]} == set(shapes)
    phase[0] = "real"
    case = make_case([(range(40), range(29, 40)), (range(21), range(13, 21)), (range(21), range(13, 21))])
    _assert_matches(provider(*case), reference(*case), torch.float32, "warmed")
    assert seen["real"] and seen["real"] <= seen["warm"]
    assert SdpaExpanded(recording, reference, True, None).warm_up(3, DIMS, torch.float32, "cpu", 16, 64) == 0


def _serve_bucketed(ctx, layouts, pass_keys):
    """The tiny model prefilling in the expanded form through the bucketed provider (math
    backend, G = 16), its passes ``pass_keys`` keys wide cut at multiples of 16: the generation, the
    (key slots, causal) of every dense call, and (plans made, provider calls). The provider may not
    copy index tensors to the host."""
    import dataclasses

    from test_runtime_expanded import PROMPTS, RUN

    from splash_bench.driver import generate
    from splash_core.model.weights import SeededWeights
    from splash_core.profiles.loader import load
    from splash_core.runtime import expanded_attention
    from splash_core.runtime.model import Model

    model = Model.from_context(ctx, load("model", "tiny-mla"), SeededWeights(3), list(layouts), pages_per_layer=40,
                               page_size=RUN["page_size"], attention_form="expanded")
    calls, plans, layer_calls = [], [], []

    def counted(q, k, v, causal, scale):
        calls.append((k.shape[2], causal))
        return math_attend(q, k, v, causal, scale)

    provider = SdpaExpanded(counted, model.kernels.expanded, True, BucketSizes(16, 2, 8))

    def each_layer(*args, host=None):
        layer_calls.append(1)
        return provider(*args, host=host)

    each_layer.takes_host_index = True
    model.kernels = dataclasses.replace(model.kernels, expanded=each_layer)
    per_key = 12 * (16 + 16) * 4  # all of tiny-mla's heads in float32 (a TP rank's passes: twice the keys)
    saved = (expanded_attention.PASS_BYTES, expanded_attention.PASS_ALIGN, expanded_sdpa.host_plan,
             expanded_sdpa.make_plan)
    expanded_attention.PASS_BYTES, expanded_attention.PASS_ALIGN = (pass_keys or 1 << 20) * per_key, 16
    expanded_sdpa.host_plan = None  # calling it fails the run
    expanded_sdpa.make_plan = lambda *args, **kwargs: plans.append(1) or saved[3](*args, **kwargs)
    try:
        prompts = [dataclasses.replace(p, owner=p.owner % ctx.world_size) for p in PROMPTS]
        gen = generate(model.step, prompts, T=ctx.world_size, release=model.release, **RUN)
    finally:
        (expanded_attention.PASS_BYTES, expanded_attention.PASS_ALIGN, expanded_sdpa.host_plan,
         expanded_sdpa.make_plan) = saved
    return gen, calls, (len(plans), len(layer_calls))


@pytest.mark.parametrize("pass_keys", [None, 16], ids=["one-pass", "16-key-passes"])
def test_serving_through_buckets_plans_on_the_host_and_matches_the_reference(rank_pools, pass_keys):
    """TP and CP on 2 gloo ranks: the same tokens as the single-device reference, no index copied
    back from the device, one host plan a step and pass for all layers, and on TP (passes cut at
    multiples of G) no history-alone call off the buckets (cut anywhere, the 8-key pages leave such
    calls: the check fails)."""
    from test_runtime_expanded import CP, TP, _same, reference

    want = reference.__wrapped__()
    for layouts in [(TP,) * 3, (CP,) * 3]:
        results = rank_pools(2).run(_serve_bucketed, layouts, pass_keys)
        for gen, _, (plans, layer_calls) in results:
            _same(gen, want, f"{layouts} buckets passes={pass_keys}")
            assert plans > 0 and layer_calls == 3 * plans  # one plan a step and pass serves tiny-mla's 3 layers
        calls = [c for _, rank_calls, _ in results for c in rank_calls]
        # a CP rank's share of a history is any number of pages: its history-alone calls keep exact shapes
        assert calls and (layouts[0] is CP or all(causal or keys % 16 == 0 for keys, causal in calls))


def test_a_benchmark_warms_the_backends_provider_on_its_rank():
    """bench/prefill_forms.py's warm-up: the backend's provider at the deployment's heads per rank
    and widths, the shapes it ran counted; a provider without a warm-up runs none."""
    import dataclasses
    from types import SimpleNamespace

    from splash_bench.expanded_warm_up import warm_expanded
    from splash_core.reference.plugin import splash_mla_kernels

    calls = []
    sizes = BucketSizes(8, 2, 8)

    def recording(q, k, v, causal, scale):
        calls.append((q.shape[1], q.shape[3], v.shape[3]))
        return math_attend(q, k, v, causal, scale)

    kernels = dataclasses.replace(splash_mla_kernels(None, None), expanded=SdpaExpanded(recording, reference, True,
                                                                                         sizes))
    ctx = SimpleNamespace(backend=SimpleNamespace(mla_kernels=lambda device, dtype: kernels), device="cpu",
                          world_size=2, streams=SimpleNamespace(synchronize=lambda: None))
    got = warm_expanded(ctx, "cpu-tiny", 16, 64)
    assert got["shapes"] == len(deployment_shapes(sizes, 16, 64)) == len(calls) > 0
    assert set(calls) == {(6, 16 + 8, 16)}  # tiny-mla: 12 heads over 2 ranks, keys 16 + 8 wide, values 16
    kernels = splash_mla_kernels(None, None)
    assert warm_expanded(ctx, "cpu-tiny", 16, 64)["shapes"] == 0


def test_the_engine_warms_the_heads_of_every_layout_it_may_run():
    """Start-up (engine/steps.build): a rank attends with H/T heads where projections are sharded
    (TP, DOP) and all H where they are replicated (DP, CP); each count is warmed."""
    from types import SimpleNamespace

    from splash_core.engine.expanded_warm_up import head_counts, warm_expanded

    assert head_counts(128, 8, ["TP", "DOP"]) == [16] and head_counts(128, 8, ["TP", "DP", "CP"]) == [16, 128]
    seen = []
    expanded = SimpleNamespace(warm_up=lambda heads, widths, *rest: seen.append((heads, widths)) or 3)
    mla = SimpleNamespace(qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    got = warm_expanded(expanded, mla, [16, 128], None, "cpu", SimpleNamespace(synchronize=lambda: None), 8192, 32768)
    assert got["shapes"] == 6 and seen == [(16, (128, 64, 128)), (128, (128, 64, 128))]
    assert warm_expanded(object(), mla, [16], None, "cpu", SimpleNamespace(synchronize=lambda: None), 1, 1)["shapes"] == 0


def test_a_warm_up_out_of_memory_stops_the_start_up_naming_the_reserve():
    from types import SimpleNamespace

    import torch

    from splash_core.engine.errors import EngineError
    from splash_core.engine.expanded_warm_up import warm_deployment
    from splash_core.profiles.loader import load

    def no_room(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB")

    deployment = load("deployment", "cpu-tiny")
    model = SimpleNamespace(kernels=SimpleNamespace(expanded=SimpleNamespace(warm_up=no_room)),
                            config=SimpleNamespace(dtype=torch.float32))
    ctx = SimpleNamespace(rank=0, world_size=2, device="cpu", streams=SimpleNamespace(synchronize=lambda: None))
    with pytest.raises(EngineError, match="rank 0: warming the expanded-form .* raise the deployment's reserve_gib"):
        warm_deployment(ctx, deployment, model, ["TP"], 8192, 32768)


def test_a_fresh_chunk_in_order_is_attended_in_place():
    """Rows that fill their query bucket in order are read where they lie (no padded copy: the same
    strides as the copy, so the same cuDNN graph); rows out of order are copied; both are exact."""
    case = list(make_case([(range(16), range(16))] * 2, seed=3))
    order = torch.argsort(case[4] * 100 + case[5])  # requests one after another, rows in position order
    case[0], case[4], case[5] = case[0][order].contiguous(), case[4][order], case[5][order]
    seen = []

    def attend(q, k, v, causal, scale):
        seen.append(q.untyped_storage().data_ptr() == case[0].untyped_storage().data_ptr())
        return math_attend(q, k, v, causal, scale)

    for rows in (case, [case[0].flip(0)] + case[1:4] + [case[4].flip(0), case[5].flip(0)] + case[6:]):
        got = expanded_sdpa.expanded_sdpa(*rows, attend=attend, fallback=reference, buckets=BucketSizes(16, 4, 4))
        _assert_matches(got, reference(*rows), torch.float32, "fresh chunk")
    assert seen == [True, False]
