"""Hugging Face checkpoints of the MLA families (the architectures of
:data:`~splash_core.profiles.checkpoint_families.FAMILIES`: DeepSeek-V2/V3/V3.2, GLM-4.7-Flash,
Kimi-Linear) and what goes with them.

Modules, one concept each:

- ``source``: :class:`CheckpointWeights`, the runtime's weight source over the safetensors files:
  each rank reads only the slices it holds, FP8 block-scaled weights dequantized, interleaved
  rotary channels put in rotate-half order.
- ``fp8``: the block-scaled e4m3 format (``weight_scale_inv``).
- ``tokenizer``: the folder's ``tokenizer.json`` through the ``tokenizers`` library.
- ``tiny``: writes the tiny DeepSeek-V3-format checkpoint SPLASH ships as data (the CPU main job's
  model) where a reader is about to open it (:func:`~splash_core.checkpoint.tiny.ensure_written`).
- ``deployments``: a deployment with its model, group size or layout replaced (``--model``, ``--T``).

A checkpoint's ``config.json`` becomes a :class:`~splash_core.profiles.model.ModelProfile` in the
profiles (:mod:`splash_core.profiles.checkpoint_config`): loading a deployment reads it, so it
imports no torch.
"""

from ..profiles.checkpoint_config import CheckpointError, profile_from_checkpoint

__all__ = ["CheckpointError", "profile_from_checkpoint"]
