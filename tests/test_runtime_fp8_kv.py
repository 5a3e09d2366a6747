"""The scaled-fp8 KV cache (DeepSeek-V3.2's format: e4m3 latent, float32 scales per group of
latent channels, bf16 rotary key; the indexer key in fp8 with one scale) in the runtime:
accuracy against the float32 and the bf16 cache, every layout and every switch direction on
it, and its bytes in capacity (Eq 1) and transfers (Eq 2).

Accuracy. e4m3 keeps 3 mantissa bits, so a stored latent element is off by at most its unit
roundoff u = 2**-4 of its magnitude (relative to its group's largest one, below e4m3's normal
range); the rotary key in bf16 is off by at most 2**-9. The tolerance the test allows the logits
is that same relative error of each row's scale, ``u * max |logit|``, and a greedy token may
differ from the float32 reference's only where the reference's top two logits lie within twice
that (each may move by the tolerance). Teacher forcing feeds both runs the reference's tokens,
so every step compares the same history. Against a bf16 cache (itself off by 2**-9) the
tolerance is ``(u + 2**-9) * max |logit|``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from switch_scenarios import PAGE, PULLS, SEED, accounting_problems, planned_bytes

from splash_bench.driver import Prompt, generate
from splash_core.layouts import DIRECTIONS, Layout, State
from splash_core.model.kv_format import ScaledFP8, scaled_layout
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.profiles.model import KVCacheFormat, LayerKind
from splash_core.runtime.kv_pool import KVPool, PageFormat
from splash_core.runtime.model import Model
from splash_core.runtime.reference_model import ReferenceModel
from splash_core.runtime.switch import Mode, SwitchExecutor

U = 2.0 ** -4  # e4m3's unit roundoff: 3 mantissa bits
TINY = load("model", "tiny-mla")
# the latent's 32 channels in 4 groups of 8; the 16-wide indexer key in fp8 with one scale (as V3.2's)
FP8 = dataclasses.replace(TINY, name="tiny-mla-fp8kv", kv_cache=KVCacheFormat("fp8", "bf16", scale_bytes=16),
                          indexer=dataclasses.replace(TINY.indexer, dtype="fp8", scale_bytes=4))
PROMPTS = [Prompt(0, 1, tuple(range(3, 40))), Prompt(1, 0, (5, 6, 7)), Prompt(2, 1, tuple(range(100, 121)))]
RUN = dict(T=2, page_size=PAGE, chunk=16, new_tokens=12)


def _fp8_model(ctx, layout, pages=24, transfer=PULLS):
    return Model.from_context(ctx, FP8, SeededWeights(SEED), layout, pages_per_layer=pages, page_size=PAGE,
                              kv_dtype=torch.float8_e4m3fn, kv_scales=4, transfer=transfer)


def _forced(ctx, layouts, forced):
    out = {}
    for layout in layouts:
        model = _fp8_model(ctx, layout)
        fmt = model.pool.format
        assert (fmt.kv_dtype, fmt.kv_width, fmt.indexer_dtype, fmt.indexer_width) == (torch.uint8, 64, torch.uint8, 20)
        out[layout] = generate(model.step, PROMPTS, release=model.release, forced=forced, **RUN)
    bf16 = Model.from_context(ctx, TINY, SeededWeights(SEED), Layout.TP, pages_per_layer=24, page_size=PAGE,
                              kv_dtype=torch.bfloat16)
    out["bf16"] = generate(bf16.step, PROMPTS, release=bf16.release, forced=forced, **RUN)
    return out


def test_fp8_logits_stay_within_e4m3_roundoff_of_the_float32_cache(rank_pools):
    ref_model = ReferenceModel(TINY, SeededWeights(SEED))
    ref = generate(ref_model.step, PROMPTS, release=ref_model.release, **RUN)
    runs = rank_pools(2).run(_forced, list(Layout), ref.tokens)[0]
    bf16 = runs.pop("bf16")
    for layout, got in runs.items():
        _check_close(got, ref, str(layout))
        worst = max(float(np.abs(a - b).max()) for (_, a), (_, b) in zip(got.steps, ref.steps))
        assert worst > 0, f"{layout}: the logits equal float32's: the pages are not fp8"
    _check_close(runs[Layout.TP], bf16, "TP against the bf16 cache", U + 2.0 ** -9)


def _logits_of(gen, rid: int, k: int) -> np.ndarray:
    """The reference's logits that chose request ``rid``'s ``k``-th generated token."""
    rows = [logits[ids.index(rid)] for ids, logits in gen.steps if rid in ids]
    return rows[len(rows) - len(gen.tokens[rid]) + k]


# ---- switches: pages move as bytes, in every direction ------------------------------------

SWITCH_AT = 4  # every request is in decode by then, request 0 with three pages of history


def _pages(model) -> dict:
    """Every page this rank holds: (layer, request, logical page) -> its KV and indexer bytes
    [PAGE, 64 + 20]."""
    out = {}
    for layer in model.layers:
        for rid in layer.kv.requests:
            logical, physical = layer.kv.pages_of(rid)
            for lp, pp in zip(logical.tolist(), physical.tolist()):
                out[(layer.index, rid, lp)] = torch.cat([layer.kv.kv[pp], layer.kv.indexer[pp]], dim=1).numpy()
    return out


def _switch_runs(ctx, transfer, forced):
    out = {}
    for src, dst in DIRECTIONS:
        model = _fp8_model(ctx, Layout(src), transfer=transfer)
        executor = SwitchExecutor(model, ctx, transfer=transfer)
        problems, info, calls = [], {}, [0]

        def step(batch, tokens):
            k = calls[0]
            calls[0] += 1
            if k != SWITCH_AT:
                logits = model.step(batch, tokens)
            else:
                info["before"], info["starts"] = _pages(model), dict(zip(batch.ids.tolist(), batch.starts.tolist()))
                info["planned"] = planned_bytes(executor, dst, batch, Mode.SPLASH, State.KV)
                logits, report = executor.step(batch, tokens, dst, Mode.SPLASH)
                info["after"] = _pages(model)
                info["moved"] = report.summary()["bytes_group"].get("kv", 0)
                info["layouts"] = [str(layer.layout) for layer in model.layers]
            problems.extend(f"step {k}: {p}" for p in accounting_problems(model, batch, ctx.rank))
            return logits

        gen = generate(step, PROMPTS, release=model.release, forced=forced, **RUN)
        out[(src, dst)] = dict(gen=gen, problems=problems, info=info)
    return out


def _history_moved_intact(per_rank, label):
    """Every page a rank holds after the switch carries, in the slots written before the
    switching step, exactly the bytes its holders had before it (replicas agreeing)."""
    before = {}
    for r in per_rank:
        for key, page in r["info"]["before"].items():
            before.setdefault(key, []).append(page)
    starts = per_rank[0]["info"]["starts"]
    checked = 0
    for rank, r in enumerate(per_rank):
        for (layer, rid, lp), page in r["info"]["after"].items():
            written = max(0, min(PAGE, starts[rid] - lp * PAGE))
            if not written:
                continue
            copies = before[(layer, rid, lp)]
            assert all(np.array_equal(c[:written], copies[0][:written]) for c in copies), f"{label}: replicas differ"
            assert np.array_equal(page[:written], copies[0][:written]), f"{label} rank {rank}: {(layer, rid, lp)} changed"
            checked += 1
    return checked


@pytest.mark.parametrize("pulls", [True, False], ids=["pulls", "collectives"])
def test_every_switch_direction_moves_fp8_pages_intact(rank_pools, pulls):
    """A switch in each of the 12 directions mid-generation (SPLASH mode, T = 2), pages pulled out
    of shared pools or sent by collectives: every page lands with the bytes it left with; after
    every step each rank holds its layout's pages and the footprint's bytes (Eq 1 at 64 bytes a
    token and layer); a switch moves the manifest's bytes (Eq 2); and, fed the tokens of the
    single-device reference that rounds its history through the same format, the logits stay
    within e4m3's roundoff of it (layouts sum in other orders, so an entry near a rounding
    boundary may land one e4m3 step away) and a greedy token differs only at a near-tie."""
    ref_model = ReferenceModel(FP8, SeededWeights(SEED), kv_dtype=torch.float8_e4m3fn)
    ref = generate(ref_model.step, PROMPTS, release=ref_model.release, **RUN)
    transfer = PULLS if pulls else dataclasses.replace(PULLS, peer_pulls=False)
    results = rank_pools(2).run(_switch_runs, transfer, ref.tokens)
    moved = 0
    for (src, dst), r in results[0].items():
        label = f"{src}->{dst}"
        per_rank = [res[(src, dst)] for res in results]
        for rank, res in enumerate(per_rank):
            assert not res["problems"], f"{label} rank {rank}: {res['problems'][:2]}"
        assert r["info"]["layouts"] == [dst.value] * TINY.num_layers, label
        assert r["info"]["moved"] == r["info"]["planned"], label
        assert r["info"]["moved"] % (PAGE * 64) == 0, label  # whole pages of 64-byte entries (Eq 2's KV)
        moved += r["info"]["moved"]
        assert _history_moved_intact(per_rank, label) > 0, label
        _check_close(r["gen"], ref, label)
    assert moved > 0


def _check_close(got, ref, label, tol=U):
    """Logits within ``tol`` of each row's scale; a greedy token differs from the reference's only
    where the reference's top two logits lie within twice that."""
    for k, ((ids, logits), (ref_ids, want)) in enumerate(zip(got.steps, ref.steps)):
        assert ids == ref_ids
        err = np.abs(logits - want).max(axis=1)
        assert np.all(err <= tol * np.abs(want).max(axis=1)), f"{label} step {k}: logit error {err}"
    for rid, tokens in got.tokens.items():
        for k, (mine, theirs) in enumerate(zip(tokens, ref.tokens[rid])):
            if mine != theirs:
                row = _logits_of(ref, rid, k)
                top2 = np.sort(row)[-2:]
                assert top2[1] - top2[0] <= 2 * tol * np.abs(row).max(), f"{label} request {rid} token {k}"


# ---- capacity and transfer bytes follow the stored format --------------------------------

def test_the_pool_stores_what_the_profile_declares():
    """DeepSeek-V3.2's profile declares 512 fp8 + 16 scale + 64 x 2 rotary bytes: 656 a token and
    layer, FlashMLA's layout, and the pool's page is exactly that, so Eq 1's k and Eq 2's bytes
    (both from the profile) are the pool's; the tiny fp8 model likewise at 64 bytes."""
    from splash_core.model.kv_format import indexer_layout
    from splash_core.runtime.model_config import _indexer_format

    for model in (load("model", "deepseek-v3.2"), FP8):
        fmt = PageFormat.scaled_fp8(64, scaled_layout(model), **_indexer_format(model))
        assert fmt.kv_page_bytes == 64 * model.kv_bytes_per_token_layer
        assert fmt.indexer_page_bytes == 64 * model.indexer_bytes_per_token_layer
        assert fmt.page_bytes * model.count(LayerKind.MLA) == 64 * model.kv_bytes_per_token  # Eq 1's k
    assert indexer_layout(load("model", "deepseek-v3.2")) == ScaledFP8(128, 0, 1)  # 128 fp8 + one scale
    assert scaled_layout(load("model", "deepseek-v3.2")) == ScaledFP8(512, 64, 4)
    assert ScaledFP8(512, 64, 4).token_bytes == 656
    budget = 2 ** 30
    per_layer = KVPool.pages_for_budget(budget, PageFormat.scaled_fp8(64, ScaledFP8(512, 64, 4)), 61)
    assert per_layer == budget // (64 * 656 * 61)  # about 2.4x the pages of a bf16 cache (1152 bytes a token)
