"""The MLA cache formats the runtime can store (no torch here: ``splash profiles check`` and
``splash run``'s checks before any rank starts use it too).

Two kinds of format:

- *element* formats: one token's latent and rotary key side by side in one floating-point
  format (fp32, bf16, fp16 or unscaled fp8 e4m3), cast on write and read back as stored (the
  attention kernels compute in the query's format);
- the *scaled fp8* format of DeepSeek-V3.2 and FlashMLA: per token the d_c latent in fp8 e4m3,
  then one float32 scale per group of d_c / G latent channels (``scale_bytes = 4 G``), then the
  d_r rotary key in bf16, unquantized: ``d_c + 4 G + 2 d_r`` bytes (656 for DeepSeek's 512 + 4
  x 4 + 64 x 2). The pool holds such a cache as a uint8 tensor of that width; a uint8 cache is
  how the kernels know the format (:class:`~splash_core.platform.interfaces.MLAKernels`). A group's
  scale is the power of two that brings its largest magnitude to at most 448 (e4m3's largest
  finite value): dividing by it is exact, so every implementation (the torch reference, the
  Triton write kernel, FlashMLA) stores and reads back the same bytes and values.
"""

from __future__ import annotations

import dataclasses
import functools

ELEMENT_FORMATS = ("fp32", "bf16", "fp16", "fp8")  # fp8 is e4m3 (dtypes.torch_dtype)
SCALE_BYTES = 4  # one float32 scale
FP8_MAX = 448.0  # largest finite e4m3 value


@dataclasses.dataclass(frozen=True)
class ScaledFP8:
    """The byte layout of one token's scaled-fp8 cache entry: latent, scales, rotary key."""

    latent_dim: int  # d_c
    rope_dim: int  # d_r
    groups: int  # float32 scales per token, each over latent_dim // groups channels

    @property
    def group_size(self) -> int:
        return self.latent_dim // self.groups

    @property
    def rope_offset(self) -> int:
        return self.latent_dim + SCALE_BYTES * self.groups

    @property
    def token_bytes(self) -> int:
        return self.rope_offset + 2 * self.rope_dim

    @classmethod
    @functools.lru_cache(maxsize=64)  # asked by every layer's cache write and attention call
    def of_width(cls, token_bytes: int, latent_dim: int, rope_dim: int) -> "ScaledFP8":
        """The layout a uint8 cache ``token_bytes`` wide holds for these dims; ValueError if none."""
        groups, rest = divmod(token_bytes - latent_dim - 2 * rope_dim, SCALE_BYTES)
        layout = cls(latent_dim, rope_dim, groups)
        problem = None if rest == 0 else "leaves a partial scale"
        problem = problem or layout.problem()
        if problem:
            raise ValueError(f"a scaled-fp8 cache of {token_bytes} bytes per token for d_c={latent_dim}, "
                             f"d_r={rope_dim}: {problem}")
        return layout

    def problem(self) -> str | None:
        """Why these dims make no valid layout, or None."""
        if self.groups < 1 or self.latent_dim % self.groups:
            return f"{self.groups} scales do not split the {self.latent_dim} latent channels evenly"
        if self.latent_dim % SCALE_BYTES or self.rope_dim % 2:
            return "the scales and the rotary key must start aligned (d_c a multiple of 4, d_r even)"
        return None


def scaled_layout(model) -> ScaledFP8 | None:
    """The scaled-fp8 layout of ``model``'s MLA cache, or None for an element format (the format
    must be one the runtime stores: :func:`kv_format_problem`)."""
    kv = model.kv_cache
    if not kv.scale_bytes:
        return None
    return ScaledFP8(model.mla.kv_lora_rank, model.mla.qk_rope_head_dim, kv.scale_bytes // SCALE_BYTES)


def indexer_layout(model) -> ScaledFP8 | None:
    """The scaled-fp8 layout of ``model``'s indexer keys (one key, no rotary part), or None where
    they carry no scales."""
    idx = model.indexer
    if idx is None or not idx.scale_bytes:
        return None
    return ScaledFP8(idx.head_dim, 0, idx.scale_bytes // SCALE_BYTES)


def kv_format_problem(model) -> str | None:
    """Why the runtime cannot store ``model``'s MLA cache (``model.kv_cache``) and indexer keys, or None."""
    idx = model.indexer
    if idx is not None and idx.scale_bytes:
        layout = indexer_layout(model)
        problem = layout.problem() if idx.dtype == "fp8" and idx.scale_bytes % SCALE_BYTES == 0 else (
            f"scaled indexer keys are fp8 with float32 scales ({SCALE_BYTES} bytes each)")
        if problem:
            return (f"indexer of model {model.name!r} ({idx.dtype}, {idx.scale_bytes} scale bytes): {problem}")
    kv = model.kv_cache
    if kv.scale_bytes:
        if (kv.latent_dtype, kv.rope_dtype) != ("fp8", "bf16") or kv.scale_bytes % SCALE_BYTES:
            return (f"a scaled cache stores an fp8 latent, float32 scales ({SCALE_BYTES} bytes each) and a bf16 "
                    f"rotary key (model {model.name!r} has latent {kv.latent_dtype}, rotary {kv.rope_dtype}, "
                    f"{kv.scale_bytes} scale bytes)")
        if model.mla is not None:
            problem = scaled_layout(model).problem()
            if problem:
                return f"model {model.name!r}: {kv.scale_bytes} scale bytes: {problem}"
        return None
    if kv.latent_dtype != kv.rope_dtype:
        return (f"without scales the runtime stores latent and rotary key in one format (model {model.name!r} "
                f"has latent {kv.latent_dtype}, rotary {kv.rope_dtype})")
    if kv.latent_dtype not in ELEMENT_FORMATS:
        return (f"the runtime stores the KV cache in {', '.join(ELEMENT_FORMATS)}, or fp8 with scales "
                f"(model {model.name!r} has {kv.latent_dtype})")
    return None
