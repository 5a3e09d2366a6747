"""Every one of the 12 directed switches, taken mid-generation in each of the three modes, gives
the tokens and logits of never switching (the single-process reference), on T = 2, 3, 4, with
pages pulled rank to rank out of shared pools (the reference backend's peer memory) and with
pages moved by collectives (chunked, through transfer buffers, all-to-alls as all-gathers).

The switching step (step 4) mixes everything a live switch must handle: a request in decode
with a long history (37-token prompt), one in decode with a short one, one in the middle of its
chunked prefill (32 of 50 prompt tokens in), one arriving with its first prefill chunk, and one
that finished at the step before (released, so gone from the plan). Owners are unbalanced and
one rank owns nothing. After the switch every layer is in the destination layout and, after
every step, each rank holds exactly its layout's pages and bytes (``ownership.footprint``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from switch_scenarios import (MODEL, PAGE, PULLS, SEED, Req, accounting_problems, assert_matches, planned_bytes, prompt,
                              reference, serve)

from splash_core.layouts import DIRECTIONS, Layout, State
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.profiles.transfer import TransferConfig
from splash_core.runtime.model import Model
from splash_core.runtime.switch import Mode, SwitchExecutor

SWITCH_AT = 4
COLLECTIVES = TransferConfig()
OWNERS = {2: [1, 1, 1, 1, 1], 3: [0, 2, 0, 2, 2], 4: [0, 3, 2, 3, 0]}  # rank 0, 1, 1 idle


def _requests(T: int) -> list[Req]:
    o = OWNERS[T]
    return [Req(0, o[0], prompt(37, 1), 7), Req(1, o[1], prompt(5, 2), 4), Req(2, o[2], prompt(20, 3), 5, arrives=1),
            Req(3, o[3], prompt(50, 4), 3, arrives=2), Req(4, o[4], prompt(9, 5), 3, arrives=SWITCH_AT)]


def _switch_runs(ctx, directions, modes, transfer=PULLS):
    """On each rank: for every (direction, mode) serve the scenario, switching at step 4; pages
    pulled out of shared pools or moved by collectives, as ``transfer`` says."""
    profile, T = load("model", MODEL), ctx.world_size
    out = {}
    for src, dst in directions:
        for mode in modes:
            model = Model.from_context(ctx, profile, SeededWeights(SEED), Layout(src), pages_per_layer=24,
                                       page_size=PAGE, transfer=transfer)
            executor = SwitchExecutor(model, ctx, transfer=transfer)
            assert (executor.io.peers is not None) == transfer.peer_pulls
            problems, info = [], {}

            def step(k, batch, tokens):
                if k != SWITCH_AT:
                    logits = model.step(batch, tokens)
                else:
                    assert {int(i) for i in batch.ids} == {0, 2, 3, 4}, "the scenario's switching step"
                    planned = {s: planned_bytes(executor, dst, batch, mode, s) for s in (State.KV, State.WEIGHTS)}
                    logits, report = executor.step(batch, tokens, dst, mode)
                    info.update(report=report.summary(), planned_kv=planned[State.KV],
                                planned_weights=planned[State.WEIGHTS],
                                layouts=[str(layer.layout) for layer in model.layers])
                problems.extend(f"step {k}: {p}" for p in accounting_problems(model, batch, ctx.rank))
                return logits

            served = serve(step, _requests(T), T, model.release)
            left = model.nbytes()
            out[(src, dst, mode)] = dict(served=served, problems=problems, info=info, left=(left["kv"], left["indexer"]))
    return out


def _switch_batches(ctx, runs, transfer):
    """Several ``_switch_runs`` with ``transfer`` (e.g. a small ``chunk_bytes``, so a layer's
    pages travel in several collectives, as long histories do on accelerators)."""
    out = {}
    for directions, modes in runs:
        out.update(_switch_runs(ctx, directions, modes, transfer))
    return out


@pytest.fixture(scope="module")
def references():
    return {T: reference(_requests(T)) for T in OWNERS}


def _check(results, ref, T):
    for key, res in results[0].items():
        src, dst, mode = key
        label = f"T={T} {src}->{dst} {mode}"
        for rank, per_rank in enumerate(results):
            r = per_rank[key]
            assert not r["problems"], f"{label} rank {rank}: {r['problems'][:3]}"
            assert r["left"] == (0, 0), f"{label} rank {rank}: pages left after every request finished"
            assert r["info"]["layouts"] == [dst.value] * 3, label
            report = r["info"]["report"]
            assert report["src"] == src.value and report["dst"] == dst.value and report["mode"] == mode, label
            # the bytes the group received are what the manifest planned (page-granular, same formats)
            assert report["bytes_group"].get("kv", 0) == r["info"]["planned_kv"], label
            assert report["bytes_group"].get("weights", 0) == r["info"]["planned_weights"], label
            # the host time of the switch work covers every layer's issuing and landing
            assert report["host_ms"] >= sum(layer["host_ms"] for layer in report["layers"]) > 0, label
            rank0 = results[0][key]["served"].logits
            for rid, rows in r["served"].logits.items():  # all-gathered logits: bitwise the same everywhere
                assert all(np.array_equal(a, b) for a, b in zip(rows, rank0[rid])), f"{label} rank {rank}"
        assert_matches(r["served"], ref, label)
    for src, dst in {(s, d) for s, d, _ in results[0]}:  # modes computing every layer in dst: the same step
        runs = [results[0][(src, dst, m)]["served"] for m in Mode if (src, dst, m) in results[0]
                and results[0][(src, dst, m)]["info"]["report"]["deferred_layer"] is None]
        for other in runs[1:]:
            for rid in runs[0].logits:
                assert all(np.array_equal(a, b) for a, b in zip(runs[0].logits[rid], other.logits[rid])), \
                    f"T={T} {src}->{dst}: modes give different logits"


@pytest.mark.parametrize("pulls", [True, False], ids=["pulls", "collectives"])
def test_all_directions_and_modes_t2(rank_pools, references, pulls):
    results = rank_pools(2).run(_switch_runs, DIRECTIONS, list(Mode), PULLS if pulls else COLLECTIVES)
    _check(results, references[2], 2)
    for (src, dst, mode), r in results[0].items():  # splash defers the first layer exactly where it moves state
        deferred = r["info"]["report"]["deferred_layer"]
        moves = any(layer["index"] == 0 and set(layer["primitives"].values()) != {"discard"}
                    for layer in r["info"]["report"]["layers"])
        assert deferred == (0 if mode is Mode.SPLASH and moves else None), (src, dst, mode, deferred)


def test_splash_without_deferral_computes_the_ready_step_t2(rank_pools):
    """With ``transfer.defer_first`` off every layer of the SPLASH step computes in the destination
    layout, so its logits are bitwise those of the ready step in every direction."""
    results = rank_pools(2).run(_switch_runs, DIRECTIONS, [Mode.SPLASH, Mode.READY],
                                dataclasses.replace(PULLS, defer_first=False))
    for src, dst in DIRECTIONS:
        splash, ready = (results[0][(src, dst, m)] for m in (Mode.SPLASH, Mode.READY))
        assert splash["info"]["report"]["deferred_layer"] is None
        for rid, rows in splash["served"].logits.items():
            assert all(np.array_equal(a, b) for a, b in zip(rows, ready["served"].logits[rid])), (src, dst, rid)


@pytest.mark.parametrize("T, chunk_bytes", [(3, 3000), (4, None)])
def test_all_directions_t3_t4(rank_pools, references, T, chunk_bytes):
    """Every direction in SPLASH mode, and the three modes on two directions through CP (whose page
    rotation depends on T): one all-to-all and one all-gather. At T = 3 a layer's pages travel in
    up to 4 chunks, the most there are (a page and its indexer keys are 3,584 bytes)."""
    modes = {(Layout.DOP, Layout.CP): list(Mode), (Layout.CP, Layout.TP): list(Mode)}
    runs = [((d,), modes.get(d, [Mode.SPLASH])) for d in DIRECTIONS]
    transfer = PULLS if chunk_bytes is None else TransferConfig(chunk_bytes=chunk_bytes)
    results = rank_pools(T).run(_switch_batches, runs, transfer)
    _check(results, references[T], T)


def _with_transfer_buffers(ctx, runs, transfer, peer_barrier=True):
    """``_switch_batches`` with side collectives that gather in place in reused transfer buffers
    (as the cuda backend's copy-engine memory, here plain host memory), and, where ``transfer``
    asks for pulls, pulls only where pages lie in runs of its ``min_run_bytes`` on average
    (fenced by the peer memory's barrier, or where not ``peer_barrier`` by collectives, as for a
    peer memory that has none); the sizes allocated, the roles held at the end, and how many
    all-gathers, all-to-alls, all-reduces and peer barriers they ran."""
    from splash_core.platform.collectives import DistCollectives, TransferBuffers

    class Counted(DistCollectives):
        def all_reduce(self, *args, **kwargs):
            calls["all_reduce"] += 1
            return super().all_reduce(*args, **kwargs)

        def all_gather_into(self, out, inp, async_op=False):
            calls["all_gather"] += 1
            if any(out.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() for b in buffers._held.values()):
                calls["into_buffers"] += 1  # in place: the input is this rank's slot of the output
                calls["in_place"] += inp.data_ptr() == out.data_ptr() + self.rank * inp.numel() * inp.element_size()
            return super().all_gather_into(out, inp, async_op)

        def all_to_all(self, *args, **kwargs):
            calls["all_to_all"] += 1
            return super().all_to_all(*args, **kwargs)

    from splash_core.reference.peer_memory import HostPeerBuffers

    side, allocated = ctx.side_collectives(), []
    calls = {"into_buffers": 0, "in_place": 0, "all_to_all": 0, "all_gather": 0, "all_reduce": 0, "barrier": 0}
    barrier = HostPeerBuffers.barrier

    def counted_barrier(self, epoch, timeout_s):
        calls["barrier"] += 1
        return barrier(self, epoch, timeout_s)
    buffers = TransferBuffers(lambda n: allocated.append(n) or torch.zeros(n, dtype=torch.uint8))
    ctx._side = Counted(side.group, ctx.device, transfer_buffers=buffers)
    HostPeerBuffers.barrier = counted_barrier if peer_barrier else None
    try:
        return _switch_batches(ctx, runs, transfer), allocated, [str(r) for r in buffers._held], calls
    finally:
        ctx._side, HostPeerBuffers.barrier = side, barrier


def test_all_gathers_through_reused_transfer_buffers_t3(rank_pools, references):
    """Side collectives with transfer buffers (how copy engines get registered memory): the
    KV's all-gathers go through them (in place), chunk after chunk, layer after layer and
    switch after switch (pages in up to 4 chunks at T = 3, allowed here), with the reference's
    tokens; each role's buffer is made once (16 MiB steps cover every layer's size)."""
    runs = [(((Layout.TP, Layout.DP), (Layout.DP, Layout.TP), (Layout.DOP, Layout.CP)), [Mode.SPLASH, Mode.BLOCKING])]
    out = rank_pools(3).run(_with_transfer_buffers, runs, TransferConfig(chunk_bytes=3000, max_chunks_buffered=4))
    _check([results for results, *_ in out], references[3], 3)
    for rank, (_, allocated, roles, calls) in enumerate(out):
        assert allocated and all(n == 16 << 20 for n in allocated) and len(allocated) == len(roles), (rank, allocated)
        assert any(r.endswith(", 3)") for r in roles), roles  # a fourth chunk's buffer
        assert calls["all_to_all"] > 0, "at T = 3 the all-to-alls stay all-to-alls"
        assert calls["into_buffers"] == calls["in_place"] > 0, (rank, calls)


def test_exchanges_as_in_place_all_gathers_t2(rank_pools, references):
    """At T = 2 with transfer buffers every KV all-to-all goes as an all-gather in place (a rank
    sends itself nothing, so the exchange is the same), packed straight into the buffer, in at
    most ``max_chunks_buffered`` collectives per layer (the default over transfer buffers), with the
    reference's tokens in every direction that moves KV by all-to-all (and one all-gather of KV
    beside them, and one of weights, which takes ordinary memory)."""
    a2a = [(s, d) for s, d in DIRECTIONS if Layout.CP in (s, d) and Layout.TP not in (s, d)]
    runs = [((*a2a, (Layout.CP, Layout.TP), (Layout.TP, Layout.DP)), [Mode.SPLASH]), (a2a[:1], [Mode.BLOCKING])]
    out = rank_pools(2).run(_with_transfer_buffers, runs, TransferConfig(chunk_bytes=3000))
    _check([results for results, *_ in out], references[2], 2)
    for rank, (_, allocated, roles, calls) in enumerate(out):
        assert calls["all_to_all"] == 0 and calls["into_buffers"] == calls["in_place"] > 0, (rank, calls)
        chunks = {r.rsplit(", ", 1)[1] for r in roles}  # each chunk of a state has a buffer of its own
        assert len(allocated) == len(roles) and chunks == {f"{k})" for k in range(TransferConfig().max_chunks_buffered)}, \
            (rank, roles)


def test_pulled_pages_take_no_page_collectives_t3(rank_pools, references):
    """With pages pulled, the directions that move only KV (weights replicated, or cut from
    replicas) run no collective at all on the side communicator and make no transfer buffer:
    per layer, only the peer memory's barriers around the pulls."""
    kv_only = ((Layout.DP, Layout.TP), (Layout.CP, Layout.TP), (Layout.CP, Layout.DOP), (Layout.DP, Layout.CP))
    out = rank_pools(3).run(_with_transfer_buffers, [(kv_only, [Mode.SPLASH, Mode.BLOCKING])], PULLS)
    _check([results for results, *_ in out], references[3], 3)
    for rank, (_, allocated, roles, calls) in enumerate(out):
        assert calls["all_gather"] == calls["all_to_all"] == calls["all_reduce"] == 0, (rank, calls)
        assert not allocated and not roles, (rank, allocated, roles)
        # per switch (8) and moving layer (3): one before the pulls, one behind them per state (KV, indexer keys)
        assert calls["barrier"] == 8 * 3 * 3, (rank, calls)


def test_pulls_without_a_peer_barrier_are_fenced_by_collectives_t2(rank_pools, references):
    """A peer memory without ``barrier``: the same pulls, fenced by one-element collectives on
    the side communicator (one before a layer's pulls, one behind them per state), with the
    reference's tokens."""
    kv_only = ((Layout.DP, Layout.TP), (Layout.DP, Layout.CP))
    out = rank_pools(2).run(_with_transfer_buffers, [(kv_only, [Mode.SPLASH])], PULLS, False)
    _check([results for results, *_ in out], references[2], 2)
    for rank, (_, allocated, roles, calls) in enumerate(out):
        assert calls["all_gather"] == calls["all_to_all"] == calls["barrier"] == 0 and not allocated, (rank, calls)
        assert calls["all_reduce"] == 2 * 3 * 3, (rank, calls)  # 2 switches, 3 moving layers, 3 per layer


def test_pages_in_short_runs_move_by_collectives_t2(rank_pools, references):
    """Shared pools, but the peer memory's copies want runs longer than the pages lie in: every
    rank agrees to move the pages by collectives (through the transfer buffers), with the
    reference's tokens."""
    kv_only = ((Layout.DP, Layout.TP), (Layout.CP, Layout.DOP))
    out = rank_pools(2).run(_with_transfer_buffers, [(kv_only, [Mode.SPLASH])],
                            dataclasses.replace(PULLS, min_run_bytes=1 << 30))
    _check([results for results, *_ in out], references[2], 2)
    for rank, (_, allocated, roles, calls) in enumerate(out):
        assert calls["into_buffers"] > 0 and allocated, (rank, calls)
