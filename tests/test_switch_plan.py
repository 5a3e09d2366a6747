"""One plan of a switch: rank 0 plans it (manifests, the layer that moves after the step, Eq 5)
and every rank executes that plan, planning nothing itself; a plan refused by Eq 5 refuses the
switch on every rank before anything moves; a plan made for another step is rejected."""

from __future__ import annotations

import pytest
from switch_scenarios import MODEL, PAGE, SEED, Req, assert_matches, prompt, reference, serve, snapshot, snapshot_diff

from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.runtime.model import Model
from splash_core.runtime.step_batch import StepBatch
from splash_core.runtime.switch import Mode, SwitchExecutor, SwitchRefused

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
            seen.update(planned_here=len(executor._cache), deferred=report.deferred_layer,
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
