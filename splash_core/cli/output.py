"""Shared output helpers: JSON for scripts; aligned tables for people (:mod:`splash_core.formatting`)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
import types
from typing import Any

from ..formatting import table  # noqa: F401  (the commands' tables)


def jsonable(obj: Any) -> Any:
    """Dataclasses, enums, mapping proxies and tuples as plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (dict, types.MappingProxyType)):
        return {str(jsonable(k)): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return obj


def print_json(obj: Any) -> None:
    json.dump(jsonable(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


MIB = float(1 << 20)
GIB = float(1 << 30)
