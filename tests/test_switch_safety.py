"""Safety of live switching: refusal before anything moves, rollback after a failed or timed-out
collective, and clear errors for a batch that leaves running requests out.

- Refused (a KV pool too small for TP; Eq 5 one byte over budget): every rank raises
  SwitchRefused with the numbers, and layouts, weights, block tables, page contents and free
  lists are exactly as before; the generation goes on and matches the reference.
- An injected collective failure at layer 1 (weights, KV, indexer; each mode; KV pulled or moved
  by collectives): every rank raises SwitchFailed naming layer 1 and the state; layers 1-2 are
  bit-for-bit as before, and layer 0 holds the destination layout where it moved first
  (blocking, ready) or its source layout where it computed the step there to move last
  (splash); serving continues in the mixed layout and a later switch completes, with the
  reference's tokens throughout.
- The same at layer 0 in splash, whose transfer runs after the step computed: layers 1-2 hold
  the destination, layer 0 its source layout with its history as before the step.
- A transfer buffer that cannot be made (registering memory with the side communicator fails):
  SwitchFailed at the first layer to move (layer 1: splash moves layer 0 last) naming the
  state, nothing moved, a later switch completes.
- A peer that never issues its collective: the others time out, every rank raises SwitchFailed
  naming the layer and state, and each rank's source state is intact.
- A rank that cannot map its peers' KV pools: every rank moves pages by collectives instead,
  with a warning naming the rank and the cause, and the switch completes.
"""

from __future__ import annotations

import pytest
import torch
from switch_scenarios import (MODEL, PAGE, PULLS, SEED, Req, accounting_problems, assert_matches, history_problems,
                              prompt, reference, serve, snapshot, snapshot_diff)

from splash_core.layouts import Layout, State
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.profiles.transfer import TransferConfig
from splash_core.runtime.model import Model
from splash_core.runtime.step_batch import StepBatch
from splash_core.runtime.switch import Fault, Mode, SwitchExecutor, SwitchFailed, SwitchRefused

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP


def _requests():
    return [Req(0, 0, prompt(40, 21), 6), Req(1, 1, prompt(35, 22), 6), Req(2, 1, prompt(4, 23), 3, arrives=2)]


def _transfer(pulls: bool) -> TransferConfig:
    return PULLS if pulls else TransferConfig()


def _model(ctx, layout, pages=16, pulls=True):
    return Model.from_context(ctx, load("model", MODEL), SeededWeights(SEED), layout, pages_per_layer=pages,
                              page_size=PAGE, transfer=_transfer(pulls))


def _unchanged(model, before, layers) -> list[str]:
    after = snapshot(model)
    return [f"layer {i}: {d}" for i in layers if (d := snapshot_diff(before[i], after[i]))]


# ---- refusal --------------------------------------------------------------------------------

def _refusals(ctx):
    """DP with 6 pages per layer at step 3 (histories of 3, 3 and 1 pages): every history on every
    rank (TP, 7 pages) cannot fit; CP can (5 pages at most while the source pages are still held)."""
    model = _model(ctx, DP, pages=6)
    executor = SwitchExecutor(model, ctx, transfer=PULLS)
    seen = {}

    def step(k, batch, tokens):
        if k == 3:
            before = snapshot(model)
            with pytest.raises(SwitchRefused) as pool_full:
                executor.step(batch, tokens, TP)
            seen["pool"] = (str(pool_full.value), pool_full.value.report.refused, _unchanged(model, before, range(3)))
            # Eq 5 one byte short of the switch's peak, then exactly at it
            peak = float(executor.plan(CP, batch).peak.max())
            executor.budget_bytes = peak - 1
            with pytest.raises(SwitchRefused) as over:
                executor.step(batch, tokens, CP)
            seen["eq5"] = (str(over.value), _unchanged(model, before, range(3)))
            left_out = StepBatch.build(batch.requests[1:], batch.T, batch.page_size)
            with pytest.raises(ValueError, match="beyond the histories of the step's batch") as stray:
                executor.step(left_out, tokens[batch.requests[0].rows:], CP)
            seen["stray"] = (str(stray.value), _unchanged(model, before, range(3)))
            executor.budget_bytes = peak
            logits, report = executor.step(batch, tokens, CP)
            seen["fits"] = report.refused
            return logits
        return model.step(batch, tokens)

    served = serve(step, _requests(), ctx.world_size, model.release)
    return seen, served, [str(layer.layout) for layer in model.layers]


def test_refused_switch_changes_nothing(rank_pools):
    results = rank_pools(2).run(_refusals)
    for rank, (seen, served, layouts) in enumerate(results):
        message, refused, diff = seen["pool"]
        assert refused and not diff, (rank, diff)
        assert "refused, nothing moved" in message and "KV pool: rank" in message and "are free" in message
        message, diff = seen["eq5"]
        assert "Eq 5: rank" in message and "GiB" in message and not diff, (rank, message, diff)
        message, diff = seen["stray"]  # request 0 (owned by rank 0) was left out of the batch
        assert message.startswith("rank 0 holds 9 pages") and not diff, (rank, message, diff)
        assert ("(requests [0] here)" in message) == (rank == 0), message
        assert seen["fits"] is False and layouts == ["CP"] * 3
        assert_matches(served, reference(_requests()), f"rank {rank}")


# ---- failure and rollback -------------------------------------------------------------------

def _fault(ctx, src, dst, state, mode, fault_ranks, timeout_s, layer=1, pulls=True):
    model = _model(ctx, Layout(src), pulls=pulls)
    executor = SwitchExecutor(model, ctx, timeout_s=timeout_s, transfer=_transfer(pulls))
    seen = {}

    def step(k, batch, tokens):
        if k == 3:
            before = snapshot(model)
            executor.fault = Fault(layer=layer, state=State(state), ranks=fault_ranks, hang=fault_ranks is not None)
            try:
                executor.step(batch, tokens, dst, mode)
            except SwitchFailed as exc:
                seen.update(layer=exc.layer, state=str(exc.state), message=str(exc), switched=exc.switched,
                            unswitched=exc.unswitched, layouts=[str(layer.layout) for layer in model.layers],
                            history=history_problems(model, batch, ctx.rank), pulled=executor.io.peers is not None,
                            # unswitched layers as before, but a splash step's layer 0: it computed the step
                            intact=_unchanged(model, before, [i for i in exc.unswitched
                                                              if not (Mode(mode) is Mode.SPLASH and i == 0)]))
            executor.fault = None
            if fault_ranks is not None:  # the side communicator is broken: stop here
                raise _Stop()
            return model.step(batch, tokens)  # the same step again, in the mixed layout
        if k == 5:
            logits, _ = executor.step(batch, tokens, dst, mode)  # the switch completes later
            return logits
        logits = model.step(batch, tokens)
        if k > 5:
            seen.setdefault("after", []).extend(accounting_problems(model, batch, ctx.rank))
        return logits

    try:
        served = serve(step, _requests(), ctx.world_size, model.release)
    except _Stop:
        served = None
    return seen, served


class _Stop(Exception):
    pass


@pytest.mark.parametrize("src, dst, state, mode, layer, pulls", [
    (TP, CP, State.WEIGHTS, Mode.SPLASH, 1, True),  # weights all-gather
    (DP, TP, State.KV, Mode.BLOCKING, 1, True),  # KV pulled from the owners
    (DP, TP, State.KV, Mode.BLOCKING, 1, False),  # KV all-gather
    (CP, DOP, State.KV, Mode.SPLASH, 1, False),  # KV all-to-all
    (CP, DOP, State.KV, Mode.SPLASH, 0, True),  # the layer that moves after the step
    (DOP, CP, State.KV, Mode.SPLASH, 0, False),
    (DOP, CP, State.INDEXER, Mode.READY, 1, True),  # indexer keys, pulled beside the KV
    (DOP, CP, State.INDEXER, Mode.READY, 1, False),  # indexer keys, in the collective after the KV one
])
def test_failed_collective_rolls_back(rank_pools, src, dst, state, mode, layer, pulls):
    results = rank_pools(2).run(_fault, src, dst, state, mode, None, None, layer, pulls)
    ref = reference(_requests())
    # splash computes layer 0 in its source layout and moves it after layers 1 and 2
    switched = {(Mode.SPLASH, 0): (1, 2), (Mode.SPLASH, 1): ()}.get((mode, layer), (0,))
    layouts = [dst.value if i in switched else src.value for i in range(3)]
    for rank, (seen, served) in enumerate(results):
        assert seen["pulled"] == pulls
        assert (seen["layer"], seen["state"]) == (layer, state.value), rank
        assert f"layer {layer}, state {state.value}" in seen["message"] and "history is intact" in seen["message"]
        assert seen["layouts"] == layouts and seen["switched"] == switched, (seen["layouts"], seen["switched"])
        assert seen["unswitched"] == tuple(i for i in range(3) if i not in switched)
        assert not seen["history"], seen["history"][:2]
        assert not seen["intact"], f"rank {rank}: source state of the layers after {layer} changed: {seen['intact']}"
        assert not seen.get("after"), seen.get("after", [])[:2]
        assert_matches(served, ref, f"{src}->{dst} rank {rank}")


def _buffer_failure(ctx, src, dst, mode):
    """Side collectives whose transfer buffers cannot be made in the first switch (as when
    registering memory with the communicator fails), then can."""
    from splash_core.platform.collectives import DistCollectives, TransferBuffers

    model = _model(ctx, Layout(src), pulls=False)
    broken = {"on": True}

    def allocate(nbytes):
        if broken["on"]:
            raise RuntimeError("window registration failed")
        return torch.zeros(nbytes, dtype=torch.uint8)

    side = ctx.side_collectives()
    ctx._side = DistCollectives(side.group, ctx.device, transfer_buffers=TransferBuffers(allocate))
    executor, seen = SwitchExecutor(model, ctx), {}

    def step(k, batch, tokens):
        if k == 3:
            before = snapshot(model)
            with pytest.raises(SwitchFailed) as failed:
                executor.step(batch, tokens, dst, mode)
            seen.update(message=str(failed.value), layer=failed.value.layer, layouts=[str(l.layout) for l in model.layers],
                        intact=_unchanged(model, before, (1, 2)), history=history_problems(model, batch, ctx.rank))
            broken["on"] = False
            return model.step(batch, tokens)
        if k == 5:
            return executor.step(batch, tokens, dst, mode)[0]
        return model.step(batch, tokens)

    try:
        served = serve(step, _requests(), ctx.world_size, model.release)
    finally:
        ctx._side = side
    return seen, served, [str(layer.layout) for layer in model.layers]


@pytest.mark.parametrize("src, dst, state", [(DP, CP, "kv"), (DP, TP, "kv")])
def test_transfer_buffer_failure_rolls_back(rank_pools, src, dst, state):
    """A transfer buffer that cannot be made fails the switch at its first all-gather (layer 1,
    the first to move in splash; at T = 2 an all-to-all is one) naming the state; nothing has
    moved (layer 0 computed the step in its source layout), and a later switch completes with
    the reference's tokens."""
    for rank, (seen, served, layouts) in enumerate(rank_pools(2).run(_buffer_failure, src, dst, Mode.SPLASH)):
        assert seen["layer"] == 1 and f"layer 1, state {state} (all_gather): transfer buffer" in seen["message"], seen
        assert "window registration failed" in seen["message"] and "history is intact" in seen["message"]
        assert seen["layouts"] == [src.value] * 3 and not seen["intact"] and not seen["history"], (rank, seen)
        assert layouts == [dst.value] * 3
        assert_matches(served, reference(_requests()), f"rank {rank}")


def test_collective_timeout_names_layer_and_state(rank_pools):
    """Rank 1 never issues layer 1's KV collective (the one behind its pulls); rank 0 gives up
    after 1 s. The side communicator is left with an unmatched operation, so this pool is
    closed afterwards."""
    pool = rank_pools(2)
    try:
        results = pool.run(_fault, CP, DP, State.KV, Mode.SPLASH, frozenset({1}), 1.0)
    finally:
        pool.close(force=True)
    for rank, (seen, _) in enumerate(results):
        assert (seen["layer"], seen["state"]) == (1, "kv"), rank
        assert ("never issued" if rank == 1 else "timed out") in seen["message"].lower(), seen["message"]
        assert seen["layouts"] == ["CP", "CP", "CP"] and not seen["history"] and not seen["intact"], seen


def test_mode_names_are_checked():
    assert Mode.parse("Blocking") is Mode.BLOCKING
    with pytest.raises(ValueError, match="expected one of splash, blocking, ready"):
        Mode.parse("fast")


def _peer_failure(ctx):
    """Rank 1 cannot map its peers' pools: every rank moves pages by collectives, with a warning."""
    import warnings

    model = _model(ctx, DP)
    if ctx.rank == 1:  # after the exchange, as a rank that fails to map a peer's pool does
        share = model.pool.memory.share

        def broken(buffer):
            share(buffer).close()
            raise OSError("mapping refused")

        model.pool.memory.share = broken
    executor = SwitchExecutor(model, ctx, transfer=PULLS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peers = executor.io.peers

    def step(k, batch, tokens):
        return executor.step(batch, tokens, TP)[0] if k == 3 else model.step(batch, tokens)

    served = serve(step, _requests(), ctx.world_size, model.release)
    return peers, [str(w.message) for w in caught], served, [str(layer.layout) for layer in model.layers]


def test_peer_memory_failure_falls_back_to_collectives(rank_pools):
    for rank, (peers, messages, served, layouts) in enumerate(rank_pools(2).run(_peer_failure)):
        assert peers is None and layouts == ["TP"] * 3, rank
        assert any("move KV pages by collectives: rank 1 could not share the KV pool (OSError: mapping refused)" in m
                   for m in messages), messages
        assert_matches(served, reference(_requests()), f"rank {rank}")
