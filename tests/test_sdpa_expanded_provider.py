"""The expanded form on torch's SDPA kernels (:mod:`splash_core.kernels.expanded_sdpa`), run here with
torch's math algorithm: the same planning, batching, strided views, merge and fallback that run
cuDNN attention on a GPU, against the float32 reference; and the per-shape choice between it and
Triton (:class:`ExpandedChoice`, the hopper backend's measured ``expanded`` table)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend

from splash_core.kernels import expanded_plan
from splash_core.kernels.expanded_choice import ExpandedChoice
from splash_core.kernels.expanded_sdpa import _view, dense_attend, math_attend, sdpa_expanded_attention
from splash_core.reference.expanded import expanded_attention as reference
from splash_core.testing.mla_inputs import expanded_case
from splash_core.testing.test_mla_kernels import _assert_matches

DIMS = (16, 8, 16)  # d_n, d_r, d_v: small, the same algebra as 128/64/128


class Spy:
    """A fallback that records the rows it was handed and answers with the reference."""

    def __init__(self):
        self.rows = []

    def __call__(self, *args):
        self.rows.append(args[0].shape[0])
        return reference(*args)


def ragged_case(dtype=torch.float32, heads=4, seed=0):
    """Five requests, rows interleaved: two of equal shape (8 rows after 24 keys of history: one
    batched call), a fresh 5-row prompt, one of 3 rows after 40 with its last page's unwritten
    slots past the last row, and one whose only keys come after its row (that row sees nothing)."""
    d_n, d_r, d_v = DIMS
    g = torch.Generator().manual_seed(seed)
    requests = [(list(range(32)), range(24, 32)), (list(range(32)), range(24, 32)), (list(range(5)), range(5)),
                (list(range(48)), range(40, 43)), (list(range(10, 20)), range(3, 4))]
    starts, k_pos, rows = [0], [], []
    for r, (keys, positions) in enumerate(requests):
        k_pos += keys
        starts.append(len(k_pos))
        rows += [(r, p) for p in positions]
    rows = [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]
    kvb = torch.randn(len(k_pos), heads, d_n + d_v, generator=g).to(dtype)
    k_rope = torch.randn(len(k_pos), d_r, generator=g).to(dtype)
    q = torch.randn(len(rows), heads, d_n + d_r, generator=g).to(dtype)
    i32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    return (q, kvb[..., :d_n], k_rope, kvb[..., d_n:], i32([r for r, _ in rows]), i32([p for _, p in rows]),
            i32(starts), i32(k_pos), (d_n + d_r) ** -0.5)


@pytest.mark.parametrize("group", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_provider_matches_reference_on_ragged_requests(dtype, group):
    spy = Spy()
    case = ragged_case(dtype)
    _assert_matches(sdpa_expanded_attention(SDPBackend.MATH, spy, group)(*case), reference(*case), dtype, "sdpa")
    assert spy.rows == []  # every request here is a dense call (or sees nothing)


def test_conformance_case_sends_only_the_cp_style_request_to_the_fallback():
    """Keys out of index order still form dense calls; a context-parallel rank's keys with gaps
    inside the chunk do not, and only that request's rows reach the fallback."""
    spy = Spy()
    case = expanded_case(torch.device("cpu"), torch.float32, heads=4, dims=DIMS)
    _assert_matches(sdpa_expanded_attention(SDPBackend.MATH, spy)(*case), reference(*case), torch.float32, "sdpa")
    assert spy.rows == [int((case[4] == 2).sum())]


@pytest.mark.parametrize("fault", ["nan", "empty", "wrong"])
def test_the_check_fails_on_planted_faults(fault):
    case = list(ragged_case())
    if fault == "nan":
        case[0] = case[0].clone()
        case[0][3, 1, 0] = float("nan")
    elif fault == "empty":  # zero rows, zero requests: a check that compares nothing must fail
        case[0], case[4], case[5], case[6] = case[0][:0], case[4][:0], case[5][:0], case[6][:1]
    provider = sdpa_expanded_attention(SDPBackend.MATH, reference)
    got = provider(*case)
    if fault == "wrong":
        got = (got[0], got[1] + 0.5)
    with pytest.raises(AssertionError):
        _assert_matches(got, reference(*case), torch.float32, "sdpa")


def test_plan_splits_history_and_chunk_and_batches_equal_shapes():
    q_req = np.array([1, 0, 0, 1, 2])
    q_pos = np.array([4, 5, 4, 5, 0])
    k_start = np.array([0, 8, 14, 14])
    k_pos = np.array([0, 1, 2, 3, 4, 5, 6, 7] + [5, 4, 3, 2, 1, 0])  # request 0: slots 6, 7 after its rows
    p = expanded_plan.plan(q_req, q_pos, k_start, k_pos)
    assert len(p.groups) == 1 and p.fallback_rows.size == 0 and p.empty_rows.tolist() == [4]
    g = p.groups[0]
    assert g.rows.tolist() == [[2, 1], [0, 3]]  # each request's rows by position
    assert g.history.tolist() == [[0, 1, 2, 3], [10, 11, 12, 13]]
    assert g.chunk.tolist() == [[4, 5], [9, 8]]  # keys at the rows' positions, in position order
    assert len(expanded_plan.plan(q_req, q_pos, k_start, k_pos, group=False).groups) == 2


@pytest.mark.parametrize("k_pos", [[0, 1, 2, 3, 5, 6], [0, 1, 2, 4, 4, 5], [0, 1, 2, 3, 4, 4]])
def test_plan_sends_what_a_square_mask_cannot_express_to_the_fallback(k_pos):
    """Keys missing inside the chunk (another CP rank's), repeated positions."""
    p = expanded_plan.plan(np.zeros(3, int), np.array([3, 4, 5]), np.array([0, 6]), np.array(k_pos))
    assert p.groups == () and sorted(p.fallback_rows.tolist()) == [0, 1, 2]


def test_rows_with_repeated_positions_go_to_the_fallback():
    p = expanded_plan.plan(np.zeros(2, int), np.array([3, 3]), np.array([0, 4]), np.arange(4))
    assert p.groups == () and p.fallback_rows.size == 2


def test_equally_spaced_runs_are_read_in_place_others_gathered():
    t = torch.arange(60.0).view(20, 3)
    view = _view(t, np.array([[2, 3, 4], [9, 10, 11]]))
    assert view.data_ptr() == t[2].data_ptr() and torch.equal(view, t[torch.tensor([[2, 3, 4], [9, 10, 11]])])
    gathered = _view(t, np.array([[2, 4, 3]]))
    assert gathered.data_ptr() != t.data_ptr() and torch.equal(gathered, t[torch.tensor([[2, 4, 3]])])
    assert expanded_plan.affine(np.array([[5, 6], [1, 2]])) is None  # runs going backwards


def test_math_attend_is_causal_on_the_square_and_returns_natural_log_lse():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g) for _ in range(3))
    out, lse = math_attend(q, k, v, True, 0.5)
    scores = (q @ k.transpose(-1, -2)) * 0.5
    assert torch.allclose(lse[..., 0], scores[..., 0, 0]) and torch.allclose(out[..., 0, :], v[..., 0, :])
    assert torch.allclose(lse[..., -1], torch.logsumexp(scores[..., -1, :], -1))


def test_a_backend_without_log_sum_exp_is_refused():
    with pytest.raises(ValueError, match="FLASH_ATTENTION"):
        dense_attend(SDPBackend.FLASH_ATTENTION)


def test_choice_runs_the_chosen_provider_and_refuses_an_unknown_name():
    calls = []
    first = lambda q, *a: calls.append("a") or "a"  # noqa: E731
    second = lambda q, *a: calls.append("b") or "b"  # noqa: E731
    choice = ExpandedChoice((("a", first), ("b", second)), lambda heads, rows: "b" if rows >= 8 else "a")
    assert choice(torch.zeros(8, 2, 3)) == "b" and choice(torch.zeros(7, 2, 3)) == "a"
    with pytest.raises(ValueError, match="'c'"):
        ExpandedChoice((("a", first),), lambda h, r: "c")(torch.zeros(1, 1, 1))
    with pytest.raises(ValueError):
        ExpandedChoice((), lambda h, r: "a")


def test_conformance_checks_every_provider_a_choice_holds():
    """The suite's check runs each provider of an :class:`ExpandedChoice`, whichever the case's
    shape picks: the SDPA provider passes, a planted wrong one among them fails it."""
    import dataclasses

    from splash_core.reference.plugin import splash_mla_kernels
    from splash_core.testing.test_mla_kernels import test_expanded_matches_reference as check

    sdpa = sdpa_expanded_attention(SDPBackend.MATH, reference)
    always = lambda heads, rows: "reference"  # noqa: E731
    kernels = dataclasses.replace(splash_mla_kernels(None, None), expanded=ExpandedChoice(
        (("reference", reference), ("sdpa", sdpa)), always))
    check(kernels, torch.device("cpu"), torch.float32)

    def wrong(*args):
        out, lse = sdpa(*args)
        return out * 1.01, lse

    kernels = dataclasses.replace(kernels, expanded=ExpandedChoice((("reference", reference), ("wrong", wrong)),
                                                                   always))
    with pytest.raises(AssertionError, match="expanded wrong"):
        check(kernels, torch.device("cpu"), torch.float32)


def test_passes_holding_part_of_the_chunk_stay_dense():
    """The runtime expands long key sets in passes: a pass may hold the chunk's first keys, a
    middle run, or its last ones (rows before the run see nothing of it, rows after see all of it)."""
    d_n, d_r, d_v = DIMS
    g = torch.Generator().manual_seed(5)
    runs = [range(0, 6), range(4, 8), range(6, 12), range(0, 3)]  # request 3: history 0..2, rows 3..11
    k_pos = [p for run in runs for p in run]
    starts = np.cumsum([0] + [len(run) for run in runs]).tolist()
    rows = [(r, p) for r in range(3) for p in range(12)] + [(3, p) for p in range(3, 12)]
    q = torch.randn(len(rows), 2, d_n + d_r, generator=g)
    kvb = torch.randn(len(k_pos), 2, d_n + d_v, generator=g)
    i32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    case = (q, kvb[..., :d_n], torch.randn(len(k_pos), d_r, generator=g), kvb[..., d_n:], i32([r for r, _ in rows]),
            i32([p for _, p in rows]), i32(starts), i32(k_pos), 0.3)
    spy = Spy()
    _assert_matches(sdpa_expanded_attention(SDPBackend.MATH, spy)(*case), reference(*case), torch.float32, "passes")
    assert spy.rows == []


def _serve_on_sdpa(ctx, layouts, pass_bytes):
    """``_serve`` of the runtime's tests with the model's expanded form on the SDPA provider (math
    backend, the model's own kernel as fallback); also how many dense calls and fallback rows ran."""
    from test_runtime_expanded import _serve

    from splash_core.kernels.expanded_sdpa import expanded_sdpa
    from splash_core.runtime.model import Model

    build, dense_calls = Model.from_context, []
    spy = Spy()

    def counted(*args):
        dense_calls.append(1)
        return math_attend(*args)

    def with_sdpa(*args, **kwargs):
        model = build(*args, **kwargs)
        sdpa = functools.partial(expanded_sdpa, attend=counted, fallback=spy)
        model.kernels = dataclasses.replace(model.kernels, expanded=sdpa)
        return model

    Model.from_context = with_sdpa
    try:
        return (*_serve(ctx, layouts, "expanded", pass_bytes), len(dense_calls), sum(spy.rows))
    finally:
        Model.from_context = build


@pytest.mark.parametrize("pass_bytes", [None, 5 * 12 * 32 * 4], ids=["one-pass", "5-key-passes"])
def test_serving_through_the_sdpa_provider_matches_the_reference(rank_pools, pass_bytes):
    """The tiny model prefilling in the expanded form on 2 gloo ranks, TP and CP (whose ranks hold
    every other page: the fallback's part), in one pass over the keys and in 5-key passes."""
    from test_runtime_expanded import CP, TP, _same, reference

    want = reference.__wrapped__()
    for layouts in [(TP,) * 3, (CP,) * 3]:
        results = rank_pools(2).run(_serve_on_sdpa, layouts, pass_bytes)
        for gen, calls, kv_left, _, _ in results:
            _same(gen, want, f"{layouts} sdpa passes={pass_bytes}")
            assert kv_left == 0
        assert sum(r[3] for r in results) > 0  # the dense path served rows


def test_plan_is_reused_for_the_same_index_tensors_only(monkeypatch):
    """Every layer of a step passes the same index tensors: one host plan serves them all; new
    tensors or an in-place change (the version counter) plan afresh and stay correct."""
    from splash_core.kernels import expanded_sdpa

    planned = []
    real = expanded_sdpa.host_plan
    monkeypatch.setattr(expanded_sdpa, "host_plan", lambda *a, **k: planned.append(1) or real(*a, **k))
    provider = sdpa_expanded_attention(SDPBackend.MATH, reference)
    case = list(ragged_case())
    provider(*case)
    provider(*case)
    assert len(planned) == 1
    case[5] = case[5].clone()
    provider(*case)
    assert len(planned) == 2
    case[5][case[4] == 3] += 1  # request 3's rows one position later: one more key seen
    _assert_matches(provider(*case), reference(*case), torch.float32, "after an in-place change")
    assert len(planned) == 3
