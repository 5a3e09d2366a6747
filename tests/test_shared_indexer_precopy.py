"""Pre-copies on GLM-5's shared-indexer layers (issue 37): a shared layer's pages hold no indexer
keys, so a pre-copy gives it its kind's page plan less the indexer plan, and sizes its pages by
the layer. Each of the 12 directed switches as a pre-copy over two steps (layers 0-1, then 2-3:
a full and a shared layer each time) then the handoff, on T = 2 with pages pulled out of the
shared peer-memory buffer, gives the tokens and logits of never switching (the sparse reference
model, which equals transformers: test_glm5_checkpoint); after every step each layer holds the
pages and the KV and indexer bytes ``ownership.footprint`` gives its layout (none for a shared
layer's indexer), and while copying each rank holds exactly the destination's missing pages.
The dense reference differs, so the comparison can fail; a shared layer given indexer pages fails
the accounting (test_shared_indexer_pages plants it).
"""

from __future__ import annotations

import pytest
from precopy_scenarios import precopy_step, releasing
from switch_scenarios import PAGE, PULLS, Req, assert_matches, prompt, serve

from splash_core.checkpoint.source import CheckpointWeights
from splash_core.layouts import DIRECTIONS
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.runtime.model import Model
from splash_core.runtime.reference_model import ReferenceModel
from splash_core.runtime.switch import SwitchExecutor

START, STEPS = 4, 2
HANDOFF = START + STEPS
REQUESTS = [Req(0, 1, prompt(37, 11), 9), Req(1, 0, prompt(20, 12), 4), Req(2, 1, prompt(50, 13), 4, arrives=1),
            Req(3, 0, prompt(9, 14), 4, arrives=START + 1)]


def _precopy_runs(ctx, folder: str):
    profile, T, out = profile_from_checkpoint(folder), ctx.world_size, {}
    for src, dst in DIRECTIONS:
        model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), src, pages_per_layer=24,
                                   page_size=PAGE, sparse_attention=True, transfer=PULLS)
        executor = SwitchExecutor(model, ctx, transfer=PULLS, budget_bytes=float(1 << 40))  # Eq 5 checked, fits
        problems, copied, live = [], [], {}
        step = precopy_step(model, executor, dst, ctx.rank, live, problems, start=START, steps=STEPS, handoff=HANDOFF,
                            on_copy=lambda r: copied.append((list(r.layers), r.paused, r.failed)))
        served = serve(step, REQUESTS, T, releasing(model, live))
        out[(src, dst)] = (served, problems, copied, [str(layer.layout) for layer in model.layers])
    return out


def test_precopies_in_every_direction_keep_the_sparse_tokens(rank_pools, glm5_folder):
    profile = profile_from_checkpoint(glm5_folder)
    want, dense = (_reference(profile, glm5_folder, sparse) for sparse in (True, False))
    results = rank_pools(2).run(_precopy_runs, glm5_folder)
    assert len(results[0]) == 12
    for (src, dst), (served, _, copied, layouts) in results[0].items():
        name = f"{src}->{dst}"
        for rank, per_rank in enumerate(results):
            assert not per_rank[(src, dst)][1], f"{name} rank {rank}: {per_rank[(src, dst)][1][:3]}"
        assert copied == [([0, 1], "", ""), ([2, 3], "", "")], name
        assert layouts == [dst.value] * 4, name
        assert_matches(served, want, name)
    with pytest.raises(AssertionError):
        assert_matches(next(iter(results[0].values()))[0], dense, "dense reference")


def _reference(profile, folder: str, sparse: bool):
    ref = ReferenceModel(profile, CheckpointWeights(folder, profile), sparse=sparse)
    return serve(lambda k, b, t: ref.step(b, t), REQUESTS, 1, ref.release)
