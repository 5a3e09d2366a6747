"""Random sequences of pre-copies, cancellations, handoffs and one-step switches during serving
(seeded) lose no token and no page on T = 2 and 4.

Each step from step 3 on, with no pre-copy running: an ordinary step, a one-step switch, or a
pre-copy of 1-3 steps to a random layout; with one running: its next step, a cancellation (the
step then runs as usual) or the handoff (a random mode; before the pre-copy completed, the layers
it has not copied move whole: a partial handoff). Requests arrive
and finish throughout. After every step each rank holds exactly its layouts' pages under the
requests' ids and, while a pre-copy runs, exactly its copies beside them; otherwise exactly its
layouts' footprint (``ownership.footprint``: weights, KV, indexer, pool pages, ``model.nbytes()``),
so a cancelled pre-copy or a handoff leaves nothing behind. At the end no page is left and every
request's tokens and logits equal the single-process reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from precopy_scenarios import precopy_problems
from switch_scenarios import MODEL, PAGE, SEED, Req, accounting_problems, assert_matches, prompt, reference, serve

from splash_core.layouts import LAYOUTS
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.runtime.model import Model
from splash_core.runtime.switch import Mode, SwitchExecutor

FIRST = 3


def _requests(T: int, seed: int) -> list[Req]:
    rng = np.random.default_rng(seed)
    owners = rng.integers(0, T, 5).tolist()
    return [Req(0, owners[0], prompt(20, 31), 44), Req(1, owners[1], prompt(37, 32), 16),
            Req(2, owners[2], prompt(33, 33), 30), Req(3, owners[3], prompt(12, 34), 20, arrives=12),
            Req(4, owners[4], prompt(50, 35), 10, arrives=30)]


def _random_precopies(ctx, seed: int):
    rng = np.random.default_rng(seed)
    model = Model.from_context(ctx, load("model", MODEL), SeededWeights(SEED), LAYOUTS[seed % 4],
                               pages_per_layer=40, page_size=PAGE)
    executor = SwitchExecutor(model, ctx)
    problems, events, live = [], [], {"pc": None}

    def other(current):
        return LAYOUTS[rng.choice([i for i, l in enumerate(LAYOUTS) if l is not current])]

    def step(k, batch, tokens):
        current, pc = model.layers[0].layout, live["pc"]
        if k >= FIRST and pc is None:
            action = rng.choice(["step", "switch", "precopy", "precopy"])
            if action == "switch":
                logits, _ = executor.step(batch, tokens, other(current), list(Mode)[rng.integers(0, 3)])
            elif action == "precopy":
                pc = live["pc"] = executor.precopy(other(current), batch, int(rng.integers(1, 4)))
                logits, report = pc.step(batch, tokens)
            else:
                logits = model.step(batch, tokens)
        elif pc is not None:
            action = rng.choice(["continue", "cancel", "handoff", "handoff"])
            if action == "handoff" and not pc.complete:
                action = "partial handoff"
            if action == "continue":
                logits, report = pc.step(batch, tokens)
            elif action == "cancel":
                pc.cancel()
                live["pc"] = None
                logits = model.step(batch, tokens)
            else:
                logits, _ = executor.step(batch, tokens, pc.dst, list(Mode)[rng.integers(0, 3)], precopy=pc)
                live["pc"] = None
        else:
            action, logits = "step", model.step(batch, tokens)
        events.append(str(action))
        pc = live["pc"]
        found = precopy_problems(model, pc, batch, ctx.rank) if pc is not None else \
            accounting_problems(model, batch, ctx.rank)
        problems.extend(f"step {k} ({action}, {model.layers[0].layout}): {p}" for p in found)
        return logits

    def release(rid):
        model.release(rid)
        if live["pc"] is not None:
            live["pc"].release(rid)

    served = serve(step, _requests(ctx.world_size, seed), ctx.world_size, release)
    left = sum(layer.kv.used_pages for layer in model.paged_layers)
    return {"served": served, "problems": problems, "events": events, "pages_left": left}


@pytest.mark.parametrize("T, seed", [(2, 0), (4, 2)])
def test_random_precopies_cancellations_and_switches_lose_nothing(rank_pools, T, seed):
    results = rank_pools(T).run(_random_precopies, seed)
    for rank, res in enumerate(results):
        assert not res["problems"], f"rank {rank}: {res['problems'][:3]}"
        assert res["pages_left"] == 0, f"rank {rank}: {res['pages_left']} pages left after every request finished"
        assert res["events"] == results[0]["events"]
    events = results[0]["events"]
    assert {"switch", "precopy", "continue", "cancel", "handoff", "partial handoff"} <= set(events), events
    assert_matches(results[0]["served"], reference(_requests(T, seed)), f"T={T} seed={seed}")
