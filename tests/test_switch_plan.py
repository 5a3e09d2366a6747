"""One plan of a switch: rank 0 plans it (manifests, the layer that moves after the step, Eq 5)
and every rank executes that plan, planning nothing itself; a plan refused by Eq 5 refuses the
switch on every rank before anything moves; a plan made for another step is rejected."""

from __future__ import annotations

import dataclasses

import pytest
from switch_scenarios import MODEL, PAGE, SEED, Req, assert_matches, prompt, reference, serve, snapshot, snapshot_diff

from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights
from splash_core.planning.manifest import plan_switch
from splash_core.planning.ownership import Batch
from splash_core.planning.scheduler import SwitchCheck
from splash_core.profiles.loader import load
from splash_core.runtime.model import Model
from splash_core.runtime.switch import Mode, SwitchExecutor, SwitchRefused
from splash_core.runtime.switch.planning import history_batch

REQUESTS = [Req(0, 0, prompt(40, 31), 6), Req(1, 1, prompt(35, 32), 6), Req(2, 1, prompt(4, 33), 3, arrives=2)]


def _shared_plans(ctx):
    """Step 3 switches DP -> CP with the plan rank 0 made and broadcast; step 4 tries CP -> TP with
    a plan Eq 5 refused on rank 0; step 5 offers step 4's plan again (another batch)."""
    model = Model.from_context(ctx, load("model", MODEL), SeededWeights(SEED), Layout.DP, pages_per_layer=24,
                               page_size=PAGE)
    executor = SwitchExecutor(model, ctx)
    host, seen = ctx.host_collectives(), {}

    def shared(plan):
        return host.broadcast_object(plan if ctx.rank == 0 else None, src=0)

    def step(k, batch, tokens):
        if k == 3:
            plan = shared(executor.plan_switch(Layout.CP, batch, Mode.SPLASH) if ctx.rank == 0 else None)
            logits, report = executor.step(batch, tokens, Layout.CP, Mode.SPLASH, plan=plan)
            seen.update(planned_here=len(executor.planner.cache), deferred=report.deferred_layer,
                        kv_bytes=report.bytes_group.get("kv", 0))
            return logits
        if k == 4:
            if ctx.rank == 0:
                executor.budget_bytes = 1.0  # no switch fits one byte
                refused = executor.plan_switch(Layout.TP, batch, Mode.SPLASH)
                executor.budget_bytes = None
            plan = seen["refused_plan"] = shared(refused if ctx.rank == 0 else None)
            before = snapshot(model)
            with pytest.raises(SwitchRefused) as exc:
                executor.step(batch, tokens, Layout.TP, Mode.SPLASH, plan=plan)
            seen.update(refusal=str(exc.value), unchanged=not any(
                snapshot_diff(a, b) for a, b in zip(before, snapshot(model))))
            return model.step(batch, tokens)
        if k == 5:
            with pytest.raises(ValueError, match="not this step's") as exc:
                executor.step(batch, tokens, Layout.TP, Mode.SPLASH, plan=seen["refused_plan"])
            seen["stale"] = str(exc.value)
        return model.step(batch, tokens)

    served = serve(step, REQUESTS, ctx.world_size, model.release)
    return served, seen, [str(layer.layout) for layer in model.layers]


def test_every_rank_executes_rank_0s_plan_t2(rank_pools):
    out = rank_pools(2).run(_shared_plans)
    want = reference(REQUESTS)
    for rank, (served, seen, layouts) in enumerate(out):
        assert_matches(served, want, f"rank {rank}")
        assert layouts == ["CP"] * 3
        assert (seen["planned_here"] > 0) == (rank == 0), seen  # only rank 0 planned the manifests
        assert seen["deferred"] == 0 and seen["kv_bytes"] > 0
        assert "Eq 5: rank" in seen["refusal"] and "nothing moved" in seen["refusal"] and seen["unchanged"]
        assert "planned for another batch" in seen["stale"]
    assert out[0][1]["kv_bytes"] == out[1][1]["kv_bytes"]


def _decided_plans(ctx):
    """Step 3 switches DP -> CP with the manifest a scheduler's decision planned (and found to fit
    Eq 5) on rank 0: the executor plans only the deferred layer and checks Eq 5 no more, though its
    own budget would refuse the switch. Without a decision it plans and checks Eq 5 itself; from a
    decision planned for other histories it plans the manifests afresh."""
    model = Model.from_context(ctx, load("model", MODEL), SeededWeights(SEED), Layout.DP, pages_per_layer=24,
                               page_size=PAGE)
    executor = SwitchExecutor(model, ctx, budget_bytes=1.0)  # no switch fits one byte
    seen = {}

    def decision(batch, histories):
        manifest = plan_switch(Layout.DP, Layout.CP, histories, model.profile, model.T, PAGE)
        return SwitchCheck(True, "planned", 0.0, manifest, histories)

    def step(k, batch, tokens):
        if k != 3:
            return model.step(batch, tokens)
        plan = None
        if ctx.rank == 0:
            hist = history_batch(batch)
            older = Batch(tuple(dataclasses.replace(r, context=r.context - 1) if r.context else r for r in hist.requests))
            stale = decision(batch, older)
            seen.update(stale_reused=executor.plan_switch(Layout.CP, batch, Mode.SPLASH, decided=stale)
                        .manifests[Layout.DP] is stale.manifest,
                        undecided_refusal=executor.plan_switch(Layout.CP, batch, Mode.SPLASH).refusal)
            executor.planner.cache.clear()
            check = decision(batch, hist)
            plan = executor.plan_switch(Layout.CP, batch, Mode.SPLASH, decided=check)
            seen.update(reused=plan.manifests[Layout.DP] is check.manifest, refusal=plan.refusal,
                        planned_here=len(executor.planner.cache), deferred_planned=plan.deferred is not None)
        plan = ctx.host_collectives().broadcast_object(plan, src=0)
        logits, _ = executor.step(batch, tokens, Layout.CP, Mode.SPLASH, plan=plan)
        return logits

    served = serve(step, REQUESTS, ctx.world_size, model.release)
    return served, seen, [str(layer.layout) for layer in model.layers]


def test_rank_0_takes_the_decisions_manifest_and_eq5_verdict_t2(rank_pools):
    out = rank_pools(2).run(_decided_plans)
    want = reference(REQUESTS)
    for rank, (served, _, layouts) in enumerate(out):
        assert_matches(served, want, f"rank {rank}")
        assert layouts == ["CP"] * 3
    seen = out[0][1]
    assert seen["reused"] and seen["refusal"] is None, seen  # the decision's manifest, its Eq 5 verdict
    assert seen["deferred_planned"] and seen["planned_here"] == 1, seen  # only the deferred layer, after the step
    assert not seen["stale_reused"], seen  # other histories: the manifests are planned here
    assert "Eq 5: rank" in seen["undecided_refusal"], seen  # no decision: Eq 5 checked here
