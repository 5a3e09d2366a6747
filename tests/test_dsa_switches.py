"""Live switches with DeepSeek Sparse Attention: each of the 12 directed switches, taken at step 4
of a mixed scenario (the switch tests' harness: long and short decodes, a chunked prefill in
progress, an arrival), in every mode, on T = 2, gives the tokens and logits of never switching:
the single-process reference model attending sparsely. The indexer keys move with their pages
(they are stored as the layers compute them: normalised and rotated), and the top-k is selected
on the rank that holds the history (CP: made global across the ranks).

The model is tiny-mla with index_topk 8 (its prompts are up to 50 tokens, so most rows attend
to a strict subset of their keys) and positive indexer head weights (exact-zero ties, which
top-k breaks arbitrarily, need every head's ReLU to be zero). The dense reference differs, so
the comparison can fail.
"""

from __future__ import annotations

import dataclasses

import pytest
from switch_scenarios import PAGE, SEED, Req, assert_matches, prompt, serve

from splash_core.layouts import DIRECTIONS, Layout
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.runtime.model import Model
from splash_core.runtime.reference_model import ReferenceModel
from splash_core.runtime.switch import Mode, SwitchExecutor

SWITCH_AT, TOPK = 4, 8
OWNERS = [1, 0, 1, 1, 0]


class PositiveHeadWeights:
    """Seeded weights whose indexer head weights are made positive."""

    def __init__(self, seed: int):
        self.seeded = SeededWeights(seed)

    def get(self, name, shape, **kw):
        t = self.seeded.get(name, shape, **kw)
        return t.abs() if name.endswith("indexer.weights_proj.weight") else t


def _profile():
    base = load("model", "tiny-mla")
    return dataclasses.replace(base, indexer=dataclasses.replace(base.indexer, topk=TOPK))


def _requests() -> list[Req]:
    o = OWNERS
    return [Req(0, o[0], prompt(37, 1), 7), Req(1, o[1], prompt(5, 2), 4), Req(2, o[2], prompt(20, 3), 5, arrives=1),
            Req(3, o[3], prompt(50, 4), 3, arrives=2), Req(4, o[4], prompt(9, 5), 3, arrives=SWITCH_AT)]


def switch_runs(ctx, profile, weights, pages_per_layer: int, page_size: int):
    """On each rank: every direction in every mode, switching at step 4, for a model of ``profile``
    reading ``weights()`` (a fresh source per run)."""
    out = {}
    for src, dst in DIRECTIONS:
        for mode in Mode:
            model = Model.from_context(ctx, profile, weights(), Layout(src), pages_per_layer=pages_per_layer,
                                       page_size=page_size, sparse_attention=True)
            executor = SwitchExecutor(model, ctx)

            def step(k, batch, tokens):
                return model.step(batch, tokens) if k != SWITCH_AT else executor.step(batch, tokens, dst, mode)[0]

            served = serve(step, _requests(), ctx.world_size, model.release)
            out[(src, dst, mode)] = (served, [str(layer.layout) for layer in model.layers])
    return out if ctx.rank == 0 else None


def reference_run(profile, weights, sparse: bool):
    ref = ReferenceModel(profile, weights, sparse=sparse)
    return serve(lambda k, b, t: ref.step(b, t), _requests(), 1, ref.release)


def assert_every_switch_matches(results: dict, want, dense) -> None:
    """Every direction and mode ends in its destination layout with ``want``'s tokens and logits,
    and the dense reference's ``dense`` would fail the same comparison."""
    assert len(results) == 12 * len(Mode)
    failed = []
    for (src, dst, mode), (served, layouts) in results.items():
        label = f"{src}->{dst} {mode}"
        assert layouts == [dst.value] * len(layouts), label
        try:
            assert_matches(served, want, label)
        except AssertionError:
            failed.append(label)
    assert not failed, failed
    with pytest.raises(AssertionError):
        assert_matches(next(iter(results.values()))[0], dense, "dense reference")


def _tiny_runs(ctx):
    return switch_runs(ctx, _profile(), lambda: PositiveHeadWeights(SEED), 24, PAGE)


def test_every_direction_and_mode_keeps_the_sparse_tokens(rank_pools):
    want = reference_run(_profile(), PositiveHeadWeights(SEED), sparse=True)
    dense = reference_run(_profile(), PositiveHeadWeights(SEED), sparse=False)
    assert_every_switch_matches(rank_pools(2).run(_tiny_runs)[0], want, dense)
