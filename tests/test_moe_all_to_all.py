"""MoE dispatch by all-to-all (issue 38): where attention leaves rows with their owners (DP, CP, DOP),
each owner sends its rows to their experts' ranks and adds the sums they return, instead of every
rank holding every row and all-reducing (:mod:`splash_core.planning.moe_dispatch`).

On the tiny DeepSeek-V3 checkpoint (8 routed experts, top-2 of 2 of 4 groups, a shared expert), at
T = 2 and 3 (3 ranks hold 3, 3 and 2 experts), the logits of every step of chunked prefill and decode
are those of the all-reduce path within float32's summation error (the sums are taken in another
order, and the shared expert is whole on every rank, computed on a share of the rows even in TP:
measured at most 4.6e-7 of the largest logit), the greedy tokens the same, and the all-to-all
path ran in every owner layout's eager steps and never in TP's (experts kept FP8 alike); a combine
that loses one rank's sums is caught. The rule itself: D against the router and the closed form of plain top-k, and the
crossing row count of ``cheaper`` against the priced seconds.
"""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
import torch
from test_fp8_ffn_weights import folders  # noqa: F401  (the FP8 checkpoint fixture)

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.checkpoint.tiny import ensure
from splash_core.engine import Job, serve
from splash_core.engine.memory_plan import deployment_memory
from splash_core.engine.policy import ScriptedPolicy
from splash_core.engine.requests import GenerationRequest
from splash_core.engine.summary import render
from splash_core.layouts import LAYOUTS, Layout
from splash_core.model.experts import route
from splash_core.planning.costmodel import CostModel
from splash_core.planning.host_overhead import uniform_batch
from splash_core.planning.moe_dispatch import OWNER_LAYOUTS, DispatchPrices, MoEDispatch, dispatch_rule, ranks_per_row
from splash_core.profiles import loader
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.runtime import expert_exchange, feed_forward
from splash_core.runtime.model import Model

PROMPTS = ([3, 17, 5, 99, 23, 8, 41, 2, 77, 120, 15, 64, 33], [88, 4, 131, 27, 60, 19, 2, 140, 70], [7, 9, 11])
TOL = 1e-5  # of the largest |logit|: float32 sums in another order (measured at most 4.6e-7)


def _run(ctx, folder: str, layout: Layout, mode: str, lose_last_rank: bool = False, **config):
    """Every step's logits and the greedy tokens, and how many MoE layers dispatched by all-to-all."""
    calls = []
    original = expert_exchange.dispatch_and_combine

    def counted(collectives, T, x, weights, experts, per, compute):
        calls.append(x.shape[0])
        if not lose_last_rank:
            return original(collectives, T, x, weights, experts, per, compute)
        mine = compute  # the planted fault: rank T - 1's experts add nothing to any row

        def compute(rows, w, e):  # noqa: F811
            return mine(rows, w, e) * (0.0 if ctx.rank == T - 1 else 1.0)
        return original(collectives, T, x, weights, experts, per, compute)

    feed_forward.dispatch_and_combine = counted  # this rank process only
    try:
        profile = profile_from_checkpoint(folder)
        rule = MoEDispatch(mode, tuple((l, 1) for l in OWNER_LAYOUTS) if mode != "all_reduce" else ())
        model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), layout, pages_per_layer=16,
                                   page_size=8, dtype=torch.float32, moe_dispatch=rule, **config)
        prompts = [Prompt(i, i % ctx.world_size, tuple(p)) for i, p in enumerate(PROMPTS)]
        got = generate(model.step, prompts, T=ctx.world_size, page_size=8, chunk=8, new_tokens=5,
                       release=model.release)
    finally:
        feed_forward.dispatch_and_combine = original
    return [logits.copy() for _, logits in got.steps], got.tokens, len(calls)


def _mismatch(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest |difference| of any step's logits, in units of that step's largest |logit| (inf
    where a step is missing, differs in shape or holds a non-finite value)."""
    if not want or len(got) != len(want):
        return float("inf")
    worst = 0.0
    for a, b in zip(got, want):
        if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()) or a.size == 0:
            return float("inf")
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)))
    return worst


@pytest.mark.parametrize("T", [2, 3])
def test_all_to_all_gives_the_all_reduce_logits_in_every_owner_layout(rank_pools, T):
    folder = str(ensure("tiny-deepseek-v3"))
    pool = rank_pools(T)
    for layout in Layout:
        want = pool.run(_run, folder, layout, "all_reduce")
        got = pool.run(_run, folder, layout, "all_to_all")
        for rank in range(T):
            (logits, tokens, calls), (ref_logits, ref_tokens, ref_calls) = got[rank], want[rank]
            assert ref_calls == 0
            assert _mismatch(logits, ref_logits) <= TOL, (layout, rank)
            assert tokens == ref_tokens and all(len(t) == 5 for t in tokens.values())
            assert (calls > 0) == (layout in OWNER_LAYOUTS), (layout, calls)


def test_experts_kept_fp8_dispatch_alike(rank_pools, folders):  # noqa: F811
    """An FP8 block-scaled checkpoint with its experts kept FP8 (32 x 32 blocks: the whole shared
    expert and the TP shards it replaces start at different blocks) dispatches as the bf16 one does."""
    pool = rank_pools(2)
    want = pool.run(_run, str(folders[1]), Layout.DP, "all_reduce", fp8_ffn=True)
    got = pool.run(_run, str(folders[1]), Layout.DP, "all_to_all", fp8_ffn=True)
    for (logits, tokens, calls), (ref_logits, ref_tokens, _) in zip(got, want):
        assert _mismatch(logits, ref_logits) <= TOL and tokens == ref_tokens and calls > 0


def test_a_combine_that_loses_a_rank_is_caught(rank_pools):
    folder = str(ensure("tiny-deepseek-v3"))
    pool = rank_pools(2)
    want = pool.run(_run, folder, Layout.DP, "all_reduce")[0][0]
    lost = pool.run(_run, folder, Layout.DP, "all_to_all", True)[0][0]
    assert _mismatch(lost, want) > 100 * TOL
    nan = [a.copy() for a in want]
    nan[-1][0, 0] = np.nan
    assert _mismatch(nan, want) == _mismatch([], want) == _mismatch(want[:-1], want) == float("inf")


def test_ranks_per_row_is_what_the_router_does_and_the_closed_form_of_plain_top_k():
    """D is the cost model's own sampling of DeepSeek's choice rule; the router itself
    (:func:`~splash_core.model.experts.route`) on random scores touches as many ranks per token
    (within 2% over 20,000 tokens: DeepSeek-V3's group limit, four of eight groups, where the top-8
    lean on every chosen group), and plain top-k picks k of E experts uniformly: D = sum over ranks
    of 1 - C(E - e_r, k) / C(E, k) (e_r experts on rank r)."""
    v3 = loader.load("model", "deepseek-v3")
    gen = torch.Generator().manual_seed(0)
    for T in (2, 3, 8):
        scores = torch.randn(20_000, v3.moe.n_routed_experts, generator=gen)
        _, chosen = route(scores, torch.eye(v3.moe.n_routed_experts), torch.zeros(v3.moe.n_routed_experts), v3.moe)
        per = -(-v3.moe.n_routed_experts // T)
        touched = torch.zeros(scores.shape[0], T, dtype=torch.bool).scatter_(1, chosen // per, True).sum(1)
        assert ranks_per_row(v3.moe, T) == pytest.approx(touched.double().mean().item(), rel=0.02), T
    assert 3.63 < ranks_per_row(v3.moe, 8) <= 4  # above uniform choice within the chosen groups
    glm = loader.load("model", "glm-5.3")  # greedy top-8 of 256
    E, k = glm.moe.n_routed_experts, glm.moe.num_experts_per_tok
    for T in (2, 3, 8):
        per = -(-E // T)
        held = [len(range(r * per, min((r + 1) * per, E))) for r in range(T)]
        uniform = sum(1 - comb(E - e, k) / comb(E, k) for e in held)
        assert ranks_per_row(glm.moe, T) == pytest.approx(uniform, rel=0.01), T


def test_cheaper_dispatches_from_the_row_count_where_the_all_to_all_is_priced_lower():
    v3, h200 = loader.load("model", "deepseek-v3"), loader.load("hardware", "h200")
    prices = DispatchPrices.of(v3, h200, 8, 2)
    rule = dispatch_rule("cheaper", v3, h200, 8, 2)
    assert rule.shared_whole and rule.from_rows
    for layout in OWNER_LAYOUTS:
        rows = dict(rule.from_rows).get(layout)
        if rows is None:  # never: the all-to-all costs more at every row count
            assert all(a2a > ar for ar, a2a in (prices.seconds(layout, n) for n in (1, 10 ** 4, 10 ** 7)))
            continue
        (ar_before, a2a_before), (ar_at, a2a_at) = (prices.seconds(layout, n) for n in (rows - 1, rows))
        assert a2a_before >= ar_before and a2a_at < ar_at
        assert rule.by_all_to_all(layout, rows) and not rule.by_all_to_all(layout, rows - 1)
        i = LAYOUTS.index(layout)
        assert rule.savings(rows)[i] == pytest.approx(ar_at - a2a_at) and rule.savings(rows - 1)[i] == 0
    assert not any(rule.by_all_to_all(Layout.TP, n) for n in (1, 10 ** 9))
    assert dispatch_rule("all_reduce", v3, h200, 8, 2) == MoEDispatch()
    assert dispatch_rule("cheaper", v3, h200, 1, 2).from_rows == ()
    with pytest.raises(ValueError, match="moe_dispatch must be one of"):
        MoEDispatch("deepep")


def test_the_cost_model_charges_what_the_runtime_runs():
    """Eq 10's t_ffn: less, by the MoE layers' saving, in the owner layouts of a prefill step the rule
    dispatches; the same in every layout of a replayed decode step (captured graphs all-reduce) and
    more in an eager one forced to dispatch; the shared experts read whole on every rank in any step
    once they are held whole."""
    v3, h200 = loader.load("model", "deepseek-v3"), loader.load("hardware", "h200")
    costs = {mode: CostModel(v3, h200, 8, page_size=64, moe_dispatch=mode) for mode in ("all_reduce", "cheaper")}
    rule = costs["cheaper"].dispatch
    rows = max(n for _, n in rule.from_rows)
    prefill = uniform_batch(8, 8192, 8, query_rows=-(-rows // 8))
    want = costs["cheaper"].ffn.moe_layers * rule.savings(8 * -(-rows // 8))
    assert want.max() > 0 and want[LAYOUTS.index(Layout.TP)] == 0
    got = costs["cheaper"].evaluate(prefill).ffn_s
    np.testing.assert_allclose(got[LAYOUTS.index(Layout.TP)] - got, want, rtol=1e-9, atol=1e-12)
    decode = uniform_batch(64, 8192, 8)
    forced = {graphs: CostModel(v3, h200, 8, page_size=64, moe_dispatch="all_to_all", decode_graphs=graphs)
              for graphs in (True, False)}
    replayed, eager = (forced[graphs].evaluate(decode).ffn_s for graphs in (True, False))
    assert forced[True].replays and np.ptp(replayed) == 0  # no owner layout dispatches in a replay
    assert replayed[0] > costs["all_reduce"].evaluate(decode).ffn_s[0]  # whole shared experts read
    assert eager[LAYOUTS.index(Layout.DP)] > eager[LAYOUTS.index(Layout.TP)]  # forced on 64 rows: latency


TP, DP, CP, DOP = Layout.TP, Layout.DP, Layout.CP, Layout.DOP
ALL_DIRECTIONS = (TP, DP, TP, CP, TP, DOP, DP, CP, DP, DOP, CP, DOP, TP)


def _deployment(T: int, dispatch: str) -> dict:
    return {"kind": "deployment", "name": "tiny-v3-dispatch", "backend": "reference", "hardware": "cpu", "T": T,
            "model": {"builtin": "tiny-deepseek-v3", "kv_cache": {"latent_dtype": "fp32", "rope_dtype": "fp32"}},
            "memory_fraction": 0.5, "reserve_gib": 0.0, "page_size": 16, "compute_dtype": "fp32",
            "moe_dispatch": dispatch}


@pytest.mark.parametrize("T", [2, 4])
def test_served_through_every_switch_the_tokens_pass_the_reference_check(rank_pools, T):
    """A deployment with ``moe_dispatch: all_to_all`` serves through all 12 switch directions with
    the all-reduce deployment's tokens and passes the reference check; the memory plan counts the
    shared experts whole, as the runtime holds them."""
    prompts = tuple(GenerationRequest(tuple(p), 14) for p in PROMPTS)
    runs = {mode: rank_pools(T).run(serve, Job(_deployment(T, mode), policy=ScriptedPolicy(ALL_DIRECTIONS, every=1),
                                               prompts=prompts))[0] for mode in ("all_reduce", "all_to_all")}
    run = runs["all_to_all"]
    assert len({(s.src, s.dst) for s in run.switches if not s.refused}) == 12
    assert [o["token_ids"] for o in run.outputs] == [o["token_ids"] for o in runs["all_reduce"].outputs]
    assert run.check["passed"] and run.check["tokens"] == len(PROMPTS) * 14
    assert run.load["moe_dispatch"]["all_to_all_layer_steps"] > 0 and "moe_dispatch" not in runs["all_reduce"].load
    assert "MoE dispatch all_to_all: all-to-all DP from 1 rows" in render(run)
    for mode, served in runs.items():
        plan = deployment_memory(loader.load("deployment", _deployment(T, mode)))
        assert plan.of(TP).parts["mlp"] == served.load["memory"]["mlp"] > 0, mode
    assert runs["all_to_all"].load["memory"]["mlp"] > runs["all_reduce"].load["memory"]["mlp"]


def test_a_model_without_routed_experts_refuses_all_to_all_by_name():
    bad = {**_deployment(2, "all_to_all"), "model": "tiny-mla"}
    with pytest.raises(loader.ProfileError, match="moe_dispatch.*needs a model with routed experts.* has none"):
        loader.load("deployment", bad)
    stand_in = {**bad, "model": "deepseek-v3.2", "hardware": "h200", "T": 8}  # dense MLPs in the runtime
    with pytest.raises(loader.ProfileError, match="moe_dispatch.*runs a dense stand-in"):
        loader.load("deployment", stand_in)
    with pytest.raises(loader.ProfileError, match="moe_dispatch"):
        loader.load("deployment", {**_deployment(2, "deepep")})
