"""Every one of the 12 directed switches as a pre-copy spanning two decode/prefill steps, then the
handoff, gives the tokens and logits of never switching (the single-process reference), on
T = 2 (pages moved by collectives, and pulled out of shared pools) and T = 3.

The pre-copy begins before step 4 and copies over steps 4 and 5 (layers 0-1, then layer 2);
step 6 hands off. Around it: a request in decode with a long history (its prefix of 2 full pages
copied), one that finishes at step 4 (it drops out: its copies are freed, layer 2 never copies
it), one in the middle of its chunked prefill (3 pages copied, the rest of its prompt is dirty
tail), and one that joins at step 5 (all dirty tail). During the pre-copy each rank serves in
the source layout with its pages untouched and holds exactly the destination's missing pages
of the copied prefixes, nothing else; after the handoff it holds exactly the destination's
pages and bytes (``ownership.footprint``), and the handoff received exactly the manifest's
dirty-tail bytes (fewer than a one-step switch where KV moves).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from precopy_scenarios import precopy_step, releasing
from switch_scenarios import MODEL, PAGE, PULLS, SEED, Req, assert_matches, prompt, reference, serve

from splash_core.layouts import DIRECTIONS, Layout, State
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.profiles.transfer import TransferConfig
from splash_core.runtime.model import Model
from splash_core.runtime.switch import SwitchExecutor

START, STEPS = 4, 2
HANDOFF = START + STEPS
OWNERS = {2: [1, 0, 1, 0], 3: [0, 2, 2, 1], 4: [3, 0, 3, 1]}  # at T = 4 rank 2 owns nothing


def _requests(T: int) -> list[Req]:
    o = OWNERS[T]
    return [Req(0, o[0], prompt(37, 11), 9), Req(1, o[1], prompt(20, 12), 4),
            Req(2, o[2], prompt(50, 13), 4, arrives=1), Req(3, o[3], prompt(9, 14), 4, arrives=START + 1)]


def _precopy_runs(ctx, directions, transfer, handoff=HANDOFF):
    profile, T = load("model", MODEL), ctx.world_size
    out = {}
    for src, dst in directions:
        model = Model.from_context(ctx, profile, SeededWeights(SEED), src, pages_per_layer=24, page_size=PAGE,
                                   transfer=transfer)
        executor = SwitchExecutor(model, ctx, transfer=transfer)
        problems, info, live = [], {"precopy": []}, {}

        def switch(pc, batch, tokens):
            info["complete"] = pc.complete
            one_step = executor.plan(dst, batch)
            tail = executor.plans(dst, batch, copied=pc.copied_pages(batch),
                                  copied_layers=None if pc.complete else tuple(sorted(pc.holding)))
            logits, report = executor.step(batch, tokens, dst, "splash", precopy=pc)
            info.update(report=report.summary(), layouts=[str(layer.layout) for layer in model.layers],
                        one_step_kv=int(one_step.fetched_bytes(State.KV).sum()),
                        tail_kv=sum(int(m.fetched_bytes(State.KV).sum()) for m in tail.values()),
                        deferred=report.deferred_layer, holding=sorted(pc.holding))
            return logits

        step = precopy_step(model, executor, dst, ctx.rank, live, problems, start=START, steps=STEPS, handoff=handoff,
                            on_copy=lambda r: info["precopy"].append(r.summary()), at_handoff=switch)
        served = serve(step, _requests(T), T, releasing(model, live))
        left = model.nbytes()
        out[(src, dst)] = dict(served=served, problems=problems, info=info, left=(left["kv"], left["indexer"]))
    return out


@pytest.fixture(scope="module")
def references():
    return {T: reference(_requests(T)) for T in OWNERS}


def _check(results, ref, T, label):
    for (src, dst), r0 in results[0].items():
        name = f"{label} {src}->{dst}"
        for rank, per_rank in enumerate(results):
            r = per_rank[(src, dst)]
            assert not r["problems"], f"{name} rank {rank}: {r['problems'][:3]}"
            assert r["left"] == (0, 0), f"{name} rank {rank}: pages left after every request finished"
            info = r["info"]
            assert info["complete"] and info["holding"] == [], name
            assert [p["layers"] for p in info["precopy"]] == [[0, 1], [2]], name
            assert not any(p["paused"] or p["failed"] for p in info["precopy"]), name
            assert info["layouts"] == [dst.value] * 3, name
        copies = sum(p["received_bytes"] for per_rank in results for p in per_rank[(src, dst)]["info"]["precopy"])
        # every rank reports the group's bytes of each pre-copy step: what all of them received
        group = [[p["group_bytes"] for p in per_rank[(src, dst)]["info"]["precopy"]] for per_rank in results]
        assert all(g == group[0] for g in group) and sum(group[0]) == copies, name
        info, report = r0["info"], r0["info"]["report"]
        # the handoff moved exactly the dirty tails' bytes the manifest planned (splash moves layer 0 after
        # the step, so its tail grows by the step's rows); where KV moves at all, fewer than one step would
        received = report["bytes_group"].get("kv", 0)
        if info["one_step_kv"]:
            assert copies > 0 and info["tail_kv"] < info["one_step_kv"], name
            assert info["tail_kv"] <= received < info["one_step_kv"] + copies, name
        else:
            assert copies == 0 and received == 0, name
        rank0 = r0["served"].logits
        for per_rank in results[1:]:
            for rid, rows in per_rank[(src, dst)]["served"].logits.items():
                assert all(np.array_equal(a, b) for a, b in zip(rows, rank0[rid])), f"{name}: ranks differ"
        assert_matches(r0["served"], ref, name)


@pytest.mark.parametrize("pulls", [False, True], ids=["collectives", "pulls"])
def test_precopy_all_directions_t2(rank_pools, references, pulls):
    results = rank_pools(2).run(_precopy_runs, DIRECTIONS, PULLS if pulls else TransferConfig())
    _check(results, references[2], 2, f"T=2 {'pulls' if pulls else 'collectives'}")


def _through_transfer_buffers(ctx, directions, transfer):
    """``_precopy_runs`` with side collectives that gather in place in reused transfer buffers (as
    copy engines' registered memory): each copy must land before the next layer's reuses them."""
    from splash_core.platform.collectives import DistCollectives, TransferBuffers

    side = ctx.side_collectives()
    ctx._side = DistCollectives(side.group, ctx.device, transfer_buffers=TransferBuffers(
        lambda n: torch.zeros(n, dtype=torch.uint8)))
    try:
        return _precopy_runs(ctx, directions, transfer)
    finally:
        ctx._side = side


def test_precopy_through_transfer_buffers_t2(rank_pools, references):
    results = rank_pools(2).run(_through_transfer_buffers, DIRECTIONS, TransferConfig())
    _check(results, references[2], 2, "T=2 transfer buffers")


@pytest.mark.parametrize("T, transfer", [(3, TransferConfig(chunk_bytes=3000)), (4, PULLS)], ids=["T3-chunks", "T4-pulls"])
def test_precopy_all_directions_t3_t4(rank_pools, references, T, transfer):
    results = rank_pools(T).run(_precopy_runs, DIRECTIONS, transfer)
    _check(results, references[T], T, f"T={T}")


def test_adopt_hands_pages_over_without_copying_or_refuses_changing_nothing():
    from splash_core.runtime.block_tables import BlockTables

    tables = BlockTables(0, 16)
    tables.alloc(7, [0, 2])
    tables.alloc(-8, [1, 3])
    physical = dict(zip(*(a.tolist() for a in tables.pages_of(-8))))
    assert tables.adopt(-8, 7) == 2
    logical, held = tables.pages_of(7)
    assert logical.tolist() == [0, 1, 2, 3] and {p: h for p, h in zip(logical.tolist(), held.tolist())
                                                  if p in physical} == physical
    assert tables.requests == [7] and tables.used_pages == 4 and tables.adopt(-8, 7) == 0
    tables.alloc(-8, [2])
    before = (tables.pages_of(7), tables.pages_of(-8), tables.free_pages, tables.version)
    with pytest.raises(ValueError, match="request 7 already holds some of pages"):
        tables.adopt(-8, 7)
    after = (tables.pages_of(7), tables.pages_of(-8), tables.free_pages, tables.version)
    assert all(np.array_equal(a, b) for x, y in zip(before[:2], after[:2]) for a, b in zip(x, y))
    assert before[2:] == after[2:]


TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP
PARTIAL_DIRECTIONS = ((DP, TP), (CP, DP), (DP, CP), (TP, CP), (DOP, TP))


def _partial_runs(ctx, directions, transfer):
    """``_precopy_runs`` handing off after the first pre-copy step: layers 0-1 copied, layer 2 not."""
    return _precopy_runs(ctx, directions, transfer, handoff=START + 1)


@pytest.mark.parametrize("T", [2, 3])
def test_an_incomplete_precopy_hands_off_what_it_copied(rank_pools, references, T):
    """The handoff counts layers 0-1's copies as held and moves layer 2 whole: the same tokens and
    logits as never switching, exactly the destination's pages after, and the handoff received the
    manifest's bytes: layer 2's whole history and the others' dirty tails."""
    results = rank_pools(T).run(_partial_runs, PARTIAL_DIRECTIONS, TransferConfig())
    for (src, dst), r0 in results[0].items():
        name = f"T={T} partial {src}->{dst}"
        for rank, per_rank in enumerate(results):
            r = per_rank[(src, dst)]
            assert not r["problems"], f"{name} rank {rank}: {r['problems'][:3]}"
            assert r["left"] == (0, 0), name
            info = r["info"]
            assert not info["complete"] and info["holding"] == [], name
            assert [p["layers"] for p in info["precopy"]] == [[0, 1]], name
            assert info["layouts"] == [dst.value] * 3, name
        info = r0["info"]
        copies = sum(p["received_bytes"] for per_rank in results for p in per_rank[(src, dst)]["info"]["precopy"])
        received = info["report"]["bytes_group"].get("kv", 0)
        if info["one_step_kv"]:
            # layer 2 of 3 moves whole (a third of the one-step switch's KV), the others their tails
            assert copies > 0 and info["one_step_kv"] / 3 <= info["tail_kv"] < info["one_step_kv"], name
            assert info["tail_kv"] <= received < info["one_step_kv"] + copies, name
        else:
            assert copies == 0 and received == 0, name
        rank0 = r0["served"].logits
        for per_rank in results[1:]:
            for rid, rows in per_rank[(src, dst)]["served"].logits.items():
                assert all(np.array_equal(a, b) for a, b in zip(rows, rank0[rid])), f"{name}: ranks differ"
        assert_matches(r0["served"], references[T], name)
