"""The MLA cache formats the runtime can store (no torch here: ``splash profiles check`` and
``splash run``'s checks before any rank starts use it too).

The KV pool holds one token's latent and rotary key side by side in one element format, cast
on write and read back as stored (the attention kernels compute in the query's format), so a
cache format runs when latent and rotary key share a floating-point format and carry no
quantization scales. Scaled formats (DeepSeek-V3.2's fp8 latent with per-token scales beside
a bf16 rotary key) and integer formats are for the cost model only until the pool stores
scales.
"""

from __future__ import annotations

STORED_FORMATS = ("fp32", "bf16", "fp16", "fp8")  # fp8 is e4m3 (dtypes.torch_dtype)


def kv_format_problem(model) -> str | None:
    """Why the runtime cannot store ``model``'s MLA cache (``model.kv_cache``), or None."""
    kv = model.kv_cache
    if kv.latent_dtype != kv.rope_dtype or kv.scale_bytes:
        return (f"the runtime stores latent and rotary key in one format without scales (model {model.name!r} "
                f"has latent {kv.latent_dtype}, rotary {kv.rope_dtype}, {kv.scale_bytes} scale bytes)")
    if kv.latent_dtype not in STORED_FORMATS:
        return (f"the runtime stores the KV cache in {', '.join(STORED_FORMATS)} (model {model.name!r} "
                f"has {kv.latent_dtype})")
    return None
