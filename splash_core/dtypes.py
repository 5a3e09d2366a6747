"""Element formats by name: bytes per element and the torch dtype used to hold them."""

from __future__ import annotations

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
NAMES = tuple(BYTES)


def nbytes(name: str) -> int:
    """Bytes per element of a named format; ValueError names the known formats."""
    try:
        return BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(NAMES)}") from None


def torch_dtype(name: str):
    """The torch dtype for a named format (fp8 is e4m3, as DeepSeek and GLM store it)."""
    import torch

    table = {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8": torch.float8_e4m3fn,
        "int8": torch.int8,
    }
    nbytes(name)
    return table[name]
