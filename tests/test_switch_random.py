"""Random sequences of 50 live switches during decode (seeded, one per step, random destination
and mode) lose no token and no page on T = 2, 3, 4.

Requests arrive and finish while the layout keeps changing. After every switching step each rank
holds exactly its destination layout's pages and bytes (``ownership.footprint``: weights, KV,
indexer, pool pages, ``model.nbytes()``); at the end no page is left and every request's tokens
and logits equal the single-process reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from switch_scenarios import MODEL, PAGE, SEED, Req, accounting_problems, assert_matches, prompt, reference, serve

from splash_core.layouts import LAYOUTS
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.runtime.model import Model
from splash_core.runtime.switch import Mode, SwitchExecutor

SWITCHES, FIRST = 50, 3  # switch at every step from step 3 (the prompts are in by then) on


def _requests(T: int, seed: int) -> list[Req]:
    rng = np.random.default_rng(seed)
    owners = rng.integers(0, T, 5).tolist()
    return [Req(0, owners[0], prompt(20, 11), 54), Req(1, owners[1], prompt(7, 12), 20),
            Req(2, owners[2], prompt(33, 13), 40), Req(3, owners[3], prompt(12, 14), 25, arrives=15),
            Req(4, owners[4], prompt(3, 15), 10, arrives=40)]


def _random_switches(ctx, seed: int):
    T = ctx.world_size
    rng = np.random.default_rng(seed)
    model = Model.from_context(ctx, load("model", MODEL), SeededWeights(SEED), LAYOUTS[seed % 4],
                               pages_per_layer=32, page_size=PAGE)
    executor = SwitchExecutor(model, ctx)
    problems, switches = [], []

    def step(k, batch, tokens):
        if FIRST <= k < FIRST + SWITCHES:
            current = model.layers[0].layout
            dst = LAYOUTS[rng.choice([i for i, l in enumerate(LAYOUTS) if l is not current])]
            mode = list(Mode)[rng.integers(0, 3)]
            logits, report = executor.step(batch, tokens, dst, mode)
            switches.append((str(current), str(dst), str(mode), report.bytes_group))
            if [layer.layout for layer in model.layers] != [dst] * len(model.layers):
                problems.append(f"step {k}: layers in {[str(l.layout) for l in model.layers]}, not {dst}")
        else:
            logits = model.step(batch, tokens)
        problems.extend(f"step {k} ({model.layers[0].layout}): {p}" for p in accounting_problems(model, batch, ctx.rank))
        return logits

    served = serve(step, _requests(T, seed), T, model.release)
    left = sum(layer.kv.used_pages for layer in model.layers)
    return {"served": served, "problems": problems, "switches": switches, "pages_left": left}


@pytest.mark.parametrize("T, seed", [(2, 0), (3, 1), (4, 2)])
def test_fifty_random_switches_lose_nothing(rank_pools, T, seed):
    results = rank_pools(T).run(_random_switches, seed)
    for rank, res in enumerate(results):
        assert not res["problems"], f"rank {rank}: {res['problems'][:3]}"
        assert res["pages_left"] == 0, f"rank {rank}: {res['pages_left']} pages left after every request finished"
    switches = results[0]["switches"]
    assert len(switches) == SWITCHES
    assert {(a, b) for a, b, _, _ in switches} and {m for _, _, m, _ in switches} == {m.value for m in Mode}
    assert any(sum(g.values()) for *_, g in switches), "some switch moved state over the network"
    assert_matches(results[0]["served"], reference(_requests(T, seed)), f"T={T} seed={seed}")
