"""Hugging Face checkpoints of the DeepSeek MLA family (DeepseekV2/V3ForCausalLM) and what goes
with them.

Modules, one concept each:

- ``config``: ``config.json`` -> a :class:`~splash_core.profiles.model.ModelProfile` (dims, MoE,
  YaRN, rotary layout), refusing what SPLASH does not support with a one-line error.
- ``source``: :class:`CheckpointWeights`, the runtime's weight source over the safetensors files:
  each rank reads only the slices it holds, FP8 block-scaled weights dequantized, interleaved
  rotary channels put in rotate-half order.
- ``fp8``: the block-scaled e4m3 format (``weight_scale_inv``).
- ``tokenizer``: the folder's ``tokenizer.json`` through the ``tokenizers`` library.
- ``tiny``: the tiny DeepSeek-V3-format checkpoint SPLASH writes itself (the CPU main job's model).
- ``deployments``: a deployment with its model, group size or layout replaced (``--model``, ``--T``).

(Importing this package imports no torch: ``config`` is read by every command that loads a
deployment.)
"""

from .config import CheckpointError, profile_from_checkpoint

__all__ = ["CheckpointError", "profile_from_checkpoint"]
