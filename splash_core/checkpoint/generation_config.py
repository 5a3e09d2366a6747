"""A checkpoint's sampling defaults: ``generation_config.json``'s sampling fields, as vLLM's
``--generation-config auto`` reads them, under the names a request gives them.

A request that omits a field gets the checkpoint's value (DeepSeek-V3, for instance, ships
``temperature: 0.6, top_p: 0.95``); ``do_sample`` is not read, as vLLM does not. A value that is
not a finite number in its field's range stops the server at start-up, naming the field, rather
than sampling every request wrongly.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..profiles.checkpoint_config import CheckpointError, optional_json_object

# generation_config.json's key -> (the request's name for it, integer?, the range it must lie in, in words)
FIELDS = {
    "temperature": ("temperature", False, lambda v: v >= 0, ">= 0"),
    "top_p": ("top_p", False, lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": ("top_k", True, lambda v: v >= -1, ">= -1 (0 and -1: every token)"),
    "min_p": ("min_p", False, lambda v: 0 <= v <= 1, "in [0, 1]"),
    "repetition_penalty": ("repetition_penalty", False, lambda v: v > 0, "> 0"),
    "max_new_tokens": ("max_tokens", True, lambda v: v >= 1, ">= 1"),
}


def sampling_defaults(folder: str | Path) -> dict[str, float]:
    """{request field: default} from ``folder/generation_config.json`` ({} where it has none)."""
    path = Path(folder).expanduser() / "generation_config.json"
    data = optional_json_object(path)
    defaults: dict[str, float] = {}
    for key, (name, integer, fits, wanted) in FIELDS.items():
        value = data.get(key)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not number or (integer and value != int(value)) or not fits(value):
            kind = "an integer" if integer else "a number"
            raise CheckpointError(str(path), key, f"expected {kind} {wanted} (got {value!r})")
        defaults[name] = int(value) if integer else float(value)
    return defaults
