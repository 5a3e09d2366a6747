"""Live switches on a GLM-5 checkpoint (shared-indexer layers: full, shared, full, shared): each of
the 12 directed switches, taken at step 4 of test_dsa_switches' mixed scenario (long and short
decodes, a chunked prefill in progress, an arrival), in every mode, on T = 2, gives the tokens
and logits of never switching: the single-process reference model attending sparsely, which
equals transformers (test_glm5_checkpoint). The shared layers store no indexer keys of their own
and reuse, in whatever layout they compute, the selection the full layer before them left on the
step. The dense reference differs, so the comparison can fail.
"""

from __future__ import annotations

from test_dsa_switches import assert_every_switch_matches, reference_run, switch_runs

from splash_core.checkpoint.source import CheckpointWeights
from splash_core.profiles.checkpoint_config import profile_from_checkpoint


def _glm5_runs(ctx, folder: str):
    profile = profile_from_checkpoint(folder)
    return switch_runs(ctx, profile, lambda: CheckpointWeights(folder, profile), 24, 16)


def test_every_direction_and_mode_keeps_the_sparse_tokens(rank_pools, glm5_folder):
    profile = profile_from_checkpoint(glm5_folder)
    want, dense = (reference_run(profile, CheckpointWeights(glm5_folder, profile), sparse) for sparse in (True, False))
    assert_every_switch_matches(rank_pools(2).run(_glm5_runs, glm5_folder)[0], want, dense)
