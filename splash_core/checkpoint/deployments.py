"""A deployment as a command line asks for it: its model replaced by a checkpoint folder
(``--model PATH``), its group size (``--T``) or initial layout changed, validated as a profile
file is, and its checkpoint checked against ``config.json`` before any rank starts."""

from __future__ import annotations

import dataclasses

from ..layouts import Layout
from ..profiles import load
from ..profiles.checkpoint_config import profile_from_checkpoint
from ..profiles.deployment import DeploymentProfile
from ..profiles.schema import ProfileError
from .tiny import ensure_written


def resolve(ref, *, model: str | None = None, T: int | None = None, layout: str | None = None) -> DeploymentProfile:
    """Deployment ``ref`` (name, path or profile) with the given replacements. A ``model`` folder's
    KV cache stores the deployment's compute format (as vLLM's ``kv_cache_dtype: auto``), all its
    layers run, and it attends over its DSA indexer's top-k keys where it has one."""
    deployment = ref if isinstance(ref, DeploymentProfile) else load("deployment", ref)
    changes: dict = {}
    if model is not None:
        fmt = deployment.compute_dtype
        changes["model"] = profile_from_checkpoint(model, {"kv_cache": {"latent_dtype": fmt, "rope_dtype": fmt}})
        changes["layers"] = None  # the deployment's layer cut was for its own model
        changes["sparse_attention"] = None  # and its attention: sparse iff the folder's model has an indexer
    if T is not None:
        changes["T"] = T
    if layout is not None:
        changes["initial_layout"] = Layout.parse(layout)
    if not changes:
        return deployment
    deployment = dataclasses.replace(deployment, **changes)
    flags = " ".join(f"--{k}" for k, v in (("model", model), ("T", T), ("layout", layout)) if v is not None)
    for problem in deployment.problems():
        raise ProfileError(f"deployment {deployment.name!r} with {flags}", problem.path, problem.reason, problem.got)
    return deployment


def check_checkpoint(deployment: DeploymentProfile) -> None:
    """Raise :class:`~splash_core.profiles.checkpoint_config.CheckpointError` naming the first tensor the
    deployment's model would read that its checkpoint lacks or shapes otherwise (headers only)."""
    profile = deployment.model
    folder = ensure_written(profile)
    if folder is None:
        return
    from ..model.weights import tensor_shapes
    from .source import CheckpointWeights

    CheckpointWeights(folder, profile).check(tensor_shapes(profile, deployment.layers))
