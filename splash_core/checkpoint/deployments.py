"""A deployment as a command line asks for it: its model replaced by a checkpoint folder
(``--model PATH``), its group size (``--T``) or initial layout changed, validated as a profile
file is, and its checkpoint checked against ``config.json`` before any rank starts."""

from __future__ import annotations

import dataclasses

from ..layouts import Layout
from ..profiles import load
from ..profiles.checkpoint_config import profile_fields, profile_from_checkpoint
from ..profiles.deployment import DeploymentProfile
from ..profiles.schema import ProfileError
from .tiny import ensure_written


def resolve(ref, *, model: str | None = None, T: int | None = None, layout: str | None = None) -> DeploymentProfile:
    """Deployment ``ref`` (name, path or profile) with the given replacements. A ``model`` folder's
    KV cache keeps the format the deployment's model asks for (DeepSeek-V3.2's scaled FP8 where
    its profile says so, indexer keys included where both models have an indexer of that width),
    all its layers run, and it attends over its DSA indexer's top-k keys where it has one."""
    deployment = ref if isinstance(ref, DeploymentProfile) else load("deployment", ref)
    changes: dict = {}
    if model is not None:
        changes["model"] = profile_from_checkpoint(model, _stored_formats(deployment, model))
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


def _stored_formats(deployment: DeploymentProfile, folder: str) -> dict:
    """Overrides of a checkpoint profile's stored formats: the deployment model's KV cache, and its
    indexer keys' format where the checkpoint's indexer has the same key width."""
    wanted = deployment.model
    overrides: dict = {"kv_cache": dataclasses.asdict(wanted.kv_cache)}
    found = profile_fields(folder)[0].get("indexer") if wanted.indexer is not None else None
    if found is not None and found["head_dim"] == wanted.indexer.head_dim:
        overrides["indexer"] = {**found, "dtype": wanted.indexer.dtype, "scale_bytes": wanted.indexer.scale_bytes}
    return overrides


def check_checkpoint(deployment: DeploymentProfile) -> None:
    """Raise :class:`~splash_core.profiles.checkpoint_config.CheckpointError` naming the first tensor the
    deployment's model would read that its checkpoint lacks or shapes otherwise, or (``ffn_weights:
    fp8``, ``attention_weights: fp8``) does not store FP8 block-scaled (headers only)."""
    profile = deployment.model
    folder = ensure_written(profile)
    if folder is None:
        return
    from ..model.mla import projection_names
    from ..model.weights import ffn_weight_names, tensor_shapes
    from .source import CheckpointWeights

    weights = CheckpointWeights(folder, profile)
    weights.check(tensor_shapes(profile, deployment.layers))
    if deployment.ffn_weights == "fp8":
        weights.check_block_scaled(ffn_weight_names(profile, deployment.layers))
    if deployment.attention_weights == "fp8":
        weights.check_block_scaled(projection_names(profile, deployment.layers))
