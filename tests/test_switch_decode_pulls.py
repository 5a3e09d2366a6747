"""Histories grown by decode, a page at a time side by side, are still pulled by a live switch
where the peer memory wants runs of several pages: the pool keeps each request's pages
consecutive (:mod:`splash_core.runtime.page_placement`), so a DP -> TP switch late in decode
pulls every layer's pages in one copy per request and side, with the reference's tokens.
(Under a free list used as a stack the same pages interleave one by one, at steps that an
early finisher's freed pages break, and move by collectives.)"""

from __future__ import annotations

import dataclasses

from switch_scenarios import MODEL, PAGE, PULLS, SEED, Req, assert_matches, prompt, reference, serve

from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.runtime.model import Model
from splash_core.runtime.switch import Mode, SwitchExecutor
from splash_core.runtime.switch.page_pulls import runs

SWITCH_AT = 50
# three requests: one page of prompt, then 4 pages of decode; a fourth that leaves early and frees its pages
REQUESTS = [Req(i, 1, prompt(PAGE, 10 + i), 60) for i in range(3)] + [Req(3, 1, prompt(40, 13), 1)]
RUN_PAGES = 2  # the pull rule's shortest average copy, in pages


def _serve_and_switch(ctx):
    profile = load("model", MODEL)
    model = Model.from_context(ctx, profile, SeededWeights(SEED), Layout.DP, pages_per_layer=40, page_size=PAGE,
                               transfer=PULLS)
    page_bytes = model.paged_layers[0].kv.format.kv_page_bytes
    executor = SwitchExecutor(model, ctx, transfer=dataclasses.replace(PULLS, min_run_bytes=RUN_PAGES * page_bytes))
    seen = {}

    def step(k, batch, tokens):
        if k != SWITCH_AT:
            return model.step(batch, tokens)
        kv = model.paged_layers[0].kv
        seen["runs"] = {rid: len(runs(kv.pages_of(rid)[1])) for rid in kv.requests}  # pitched ones count as one
        seen["pages"] = {rid: int(kv.pages_of(rid)[1].size) for rid in kv.requests}
        logits, report = executor.step(batch, tokens, Layout.TP, Mode.SPLASH)
        seen["primitives"] = [layer.primitives for layer in report.layers]
        return logits

    served = serve(step, REQUESTS, ctx.world_size, model.release)
    return served, seen


def test_decode_grown_histories_are_pulled_in_long_runs_t2(rank_pools):
    out = rank_pools(2).run(_serve_and_switch)
    want = reference(REQUESTS)
    for rank, (served, seen) in enumerate(out):
        assert_matches(served, want, f"rank {rank}")
        assert seen["primitives"] and all(p["kv"] == "pull" for p in seen["primitives"]), (rank, seen["primitives"])
    owner = out[1][1]
    assert owner["pages"] == {i: 5 for i in range(3)}  # 16 prompt + 50 tokens: pages 0..4, opened side by side
    assert owner["runs"] == {i: 1 for i in range(3)}, owner["runs"]
