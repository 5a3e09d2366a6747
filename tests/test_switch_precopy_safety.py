"""Safety of pre-copy switches (T = 2): memory pressure pauses them or makes them fall back without
exceeding Eq 5 or the KV pool, and a failure leaves every history intact.

- Eq 5: with a budget that holds the source state and the steps' new pages but not the copies,
  every pre-copy step copies nothing (paused, with the numbers) and holds no more than the
  budget; once the pre-copy is due, the fallback (cancel it, then the one-step switch) is refused
  by Eq 5 too, so the step runs in the source layout. With the budget raised, a new pre-copy
  completes and hands off. Tokens equal the reference throughout.
- KV pool: 6 pages per layer; while a third request holds pages, one rank's pool cannot take its
  copies beside the step's new pages (paused); once it finished, the copies go ahead and the
  handoff to TP fills the pool exactly.
- An injected collective failure at layer 1 while its prefix copies (KV pulled, or moved by an
  all-gather): the pre-copy is cancelled on every rank, reported as failed, and every rank holds
  exactly its source footprint again (no copy left); the step it ran beside gave the reference's
  logits, and a later pre-copy completes.
- A failure at layer 1 during the handoff: SwitchFailed; after cancelling the pre-copy every
  history is intact (each layer holds exactly its own layout's pages), serving goes on in the
  mixed layout and a later one-step switch completes.
"""

from __future__ import annotations

import pytest
from precopy_scenarios import precopy_problems
from switch_scenarios import (MODEL, PAGE, PULLS, SEED, Req, accounting_problems, assert_matches, history_problems,
                              prompt, reference, serve)

from splash_core.layouts import Layout, State
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.profiles.transfer import TransferConfig
from splash_core.runtime.model import Model
from splash_core.runtime.switch import Fault, SwitchExecutor, SwitchFailed, SwitchRefused

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP


def _model(ctx, layout, pages, transfer=PULLS):
    return Model.from_context(ctx, load("model", MODEL), SeededWeights(SEED), layout, pages_per_layer=pages,
                              page_size=PAGE, transfer=transfer)


def _attention_bytes(model) -> int:
    held = model.nbytes()
    return held["weights"] + held["kv"] + held["indexer"] + held["recurrent"]


def _serve_with(model, reqs, step):
    live = {"pc": None}

    def release(rid):
        model.release(rid)
        if live["pc"] is not None:
            live["pc"].release(rid)

    return serve(lambda k, b, t: step(k, b, t, live), reqs, model.T, release)


# ---- memory pressure ---------------------------------------------------------------------------

def _eq5_requests():
    return [Req(0, 0, prompt(40, 41), 10), Req(1, 1, prompt(40, 42), 10)]


def _eq5_pressure(ctx):
    model = _model(ctx, DP, pages=24)
    executor = SwitchExecutor(model, ctx, transfer=PULLS)
    page_bytes = model.pool.format.page_bytes * len(model.paged_layers)
    seen = {"reports": [], "over": [], "problems": []}

    def step(k, batch, tokens, live):
        if k == 3:  # room for the source state and a new page per layer, not for the copies
            executor.budget_bytes = _attention_bytes(model) + page_bytes
            live["pc"] = executor.precopy(TP, batch, 2)
        pc = live["pc"]
        if 3 <= k < 5:
            logits, report = pc.step(batch, tokens)
            seen["reports"].append(report.summary())
            seen["problems"] += precopy_problems(model, pc, batch, ctx.rank)
            seen["over"].append(_attention_bytes(model) - executor.budget_bytes)
            return logits
        if k == 5:  # due, not complete: fall back to the one-step switch, which Eq 5 refuses as well
            seen["due"] = (pc.due, pc.complete)
            pc.cancel()
            live["pc"] = None
            try:
                executor.step(batch, tokens, TP)
            except SwitchRefused as exc:
                seen["refused"] = str(exc)
            seen["problems"] += accounting_problems(model, batch, ctx.rank)
            return model.step(batch, tokens)
        if k == 6:
            executor.budget_bytes = None
            live["pc"] = executor.precopy(TP, batch, 1)
            logits, report = live["pc"].step(batch, tokens)
            seen["resumed"] = report.summary()
            return logits
        if k == 7:
            logits, _ = executor.step(batch, tokens, TP, precopy=live["pc"])
            live["pc"] = None
            seen["layouts"] = [str(layer.layout) for layer in model.layers]
            return logits
        logits = model.step(batch, tokens)
        seen["problems"] += accounting_problems(model, batch, ctx.rank)
        return logits

    return seen, _serve_with(model, _eq5_requests(), step)


def test_precopy_pauses_and_falls_back_within_eq5(rank_pools):
    results = rank_pools(2).run(_eq5_pressure)
    ref = reference(_eq5_requests())
    for rank, (seen, served) in enumerate(results):
        assert not seen["problems"], seen["problems"][:3]
        assert [r["layers"] for r in seen["reports"]] == [[], []]
        assert all(r["paused"].startswith("Eq 5: rank") and "GiB" in r["paused"] for r in seen["reports"]), seen
        assert max(seen["over"]) <= 0, f"rank {rank} held more than its budget: {seen['over']}"
        assert seen["due"] == (True, False)
        assert "Eq 5: rank" in seen["refused"] and "nothing moved" in seen["refused"]
        assert seen["resumed"]["layers"] == [0, 1, 2] and seen["resumed"]["complete"]
        assert seen["layouts"] == ["TP"] * 3
        assert_matches(served, ref, f"rank {rank}")


def _pool_requests():
    return [Req(0, 0, prompt(40, 51), 8), Req(1, 1, prompt(40, 52), 8), Req(2, 1, prompt(20, 53), 3)]


def _pool_pressure(ctx):
    model = _model(ctx, DP, pages=6, transfer=TransferConfig())
    executor = SwitchExecutor(model, ctx)
    seen = {"reports": [], "problems": []}

    def step(k, batch, tokens, live):
        if k == 2:
            live["pc"] = executor.precopy(TP, batch, 6)
        pc = live["pc"]
        if pc is not None and not pc.complete:
            logits, report = pc.step(batch, tokens)
            seen["reports"].append(report.summary())
            seen["problems"] += precopy_problems(model, pc, batch, ctx.rank)
            return logits
        if pc is not None:
            logits, _ = executor.step(batch, tokens, TP, precopy=pc)
            live["pc"] = None
            seen["handoff"] = (k, [layer.kv.free_pages for layer in model.paged_layers])
        else:
            logits = model.step(batch, tokens)
        seen["problems"] += accounting_problems(model, batch, ctx.rank)
        return logits

    return seen, _serve_with(model, _pool_requests(), step)


def test_precopy_pauses_while_the_pool_is_short(rank_pools):
    results = rank_pools(2).run(_pool_pressure)
    ref = reference(_pool_requests())
    for rank, (seen, served) in enumerate(results):
        assert not seen["problems"], seen["problems"][:3]
        reports = seen["reports"]
        assert [r["layers"] for r in reports] == [[], [], [0], [1], [2]], reports
        assert all(r["paused"].startswith("KV pool: rank 1 layer 0") for r in reports[:2]), reports[:2]
        assert seen["handoff"] == (7, [0, 0, 0]), seen["handoff"]  # TP fills the 6 pages exactly
        assert_matches(served, ref, f"rank {rank}")


# ---- failures ------------------------------------------------------------------------------------

def _fault_requests():
    return [Req(0, 0, prompt(40, 61), 9), Req(1, 1, prompt(35, 62), 9), Req(2, 1, prompt(4, 63), 3, arrives=2)]


def _precopy_fault(ctx, src, dst, transfer):
    model = _model(ctx, src, pages=16, transfer=transfer)
    executor = SwitchExecutor(model, ctx, transfer=transfer)
    seen = {"problems": []}

    def step(k, batch, tokens, live):
        if k == 3:
            live["pc"] = pc = executor.precopy(dst, batch, 2)
            executor.fault = Fault(layer=1, state=State.KV)
            logits, report = pc.step(batch, tokens)
            executor.fault = None
            live["pc"] = None
            seen.update(report=report.summary(), cancelled=pc.cancelled,
                        after=accounting_problems(model, batch, ctx.rank))
            return logits
        if k == 5:
            live["pc"] = executor.precopy(dst, batch, 1)
            return live["pc"].step(batch, tokens)[0]
        if k == 6:
            logits, _ = executor.step(batch, tokens, dst, precopy=live["pc"])
            live["pc"] = None
            seen["layouts"] = [str(layer.layout) for layer in model.layers]
            return logits
        logits = model.step(batch, tokens)
        seen["problems"] += accounting_problems(model, batch, ctx.rank)
        return logits

    return seen, _serve_with(model, _fault_requests(), step)


@pytest.mark.parametrize("src, dst, pulls", [(DP, TP, True), (CP, DP, False)], ids=["DP-TP-pulls", "CP-DP-gather"])
def test_failed_precopy_cancels_and_keeps_every_history(rank_pools, src, dst, pulls):
    results = rank_pools(2).run(_precopy_fault, src, dst, PULLS if pulls else TransferConfig())
    ref = reference(_fault_requests())
    for rank, (seen, served) in enumerate(results):
        report = seen["report"]
        assert report["failed"].startswith("layer 1, state kv") and "injected fault" in report["failed"], report
        assert report["layers"] == [] and seen["cancelled"]
        assert not seen["after"], seen["after"][:3]  # the source footprint exactly: no copy left
        assert not seen["problems"], seen["problems"][:3]
        assert seen["layouts"] == [dst.value] * 3
        assert_matches(served, ref, f"{src}->{dst} rank {rank}")


def _handoff_fault(ctx):
    model = _model(ctx, CP, pages=16)
    executor = SwitchExecutor(model, ctx, transfer=PULLS)
    seen = {"problems": []}

    def step(k, batch, tokens, live):
        if k == 3:
            live["pc"] = executor.precopy(TP, batch, 1)
            return live["pc"].step(batch, tokens)[0]
        if k == 4:
            pc = live["pc"]
            executor.fault = Fault(layer=1, state=State.KV)
            try:
                executor.step(batch, tokens, TP, "blocking", precopy=pc)
            except SwitchFailed as exc:
                seen.update(failed=(exc.layer, exc.switched, exc.unswitched))
            executor.fault = None
            pc.cancel()
            live["pc"] = None
            seen["history"] = history_problems(model, batch, ctx.rank)
            seen["layouts"] = [str(layer.layout) for layer in model.layers]
            return model.step(batch, tokens)  # the same step again, in the mixed layout
        if k == 6:
            logits, _ = executor.step(batch, tokens, TP)
            seen["final"] = [str(layer.layout) for layer in model.layers]
        else:
            logits = model.step(batch, tokens)
        if k > 4:
            seen["problems"] += accounting_problems(model, batch, ctx.rank)
        return logits

    return seen, _serve_with(model, _fault_requests(), step)


def test_failed_handoff_keeps_every_history(rank_pools):
    results = rank_pools(2).run(_handoff_fault)
    ref = reference(_fault_requests())
    for rank, (seen, served) in enumerate(results):
        assert seen["failed"] == (1, (0,), (1, 2)), seen["failed"]
        assert seen["layouts"] == ["TP", "CP", "CP"]
        assert not seen["history"], seen["history"][:3]
        assert not seen["problems"], seen["problems"][:3]
        assert seen["final"] == ["TP"] * 3
        assert_matches(served, ref, f"rank {rank}")
