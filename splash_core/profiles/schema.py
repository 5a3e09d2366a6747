"""Typed, frozen profile dataclasses built from YAML mappings, validated at load.

Every field carries a docstring (``doc``) and optional checks. A bad value raises
:class:`ProfileError` rendered as ``file: key.path: reason (got X)``.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, Callable, Iterable, Mapping

_MISSING = object()
# Set by the loader: (kind, reference, referring file) -> profile. Lets a deployment name its
# hardware and model profiles while errors keep naming the file they are in.
_resolver = None


def set_reference_resolver(resolver) -> None:
    global _resolver
    _resolver = resolver


class ProfileError(ValueError):
    """A profile that cannot be loaded; names the file, the key path and the reason."""

    def __init__(self, file: str, path: str, reason: str, got: Any = _MISSING):
        self.file, self.path, self.reason, self.got = str(file), path or "(top)", reason, got
        text = f"{self.file}: {self.path}: {reason}"
        if got is not _MISSING:
            text += f" (got {_show(got)})"
        super().__init__(text)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


Check = Callable[[Any], "str | None"]


def field(doc: str, *, default: Any = _MISSING, default_factory: Any = _MISSING,
          checks: Iterable[Check] = (), parse: Callable | None = None) -> Any:
    """A dataclass field with a docstring and value checks (each returns a reason or None).
    ``parse(value, file=, path=)`` reads its YAML value instead of the field type's conversion."""
    meta = {"doc": doc, "checks": tuple(checks), "parse": parse}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    if default is _MISSING:
        return dataclasses.field(metadata=meta)
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults are not allowed in frozen profiles")
    return dataclasses.field(default=default, metadata=meta)


# ---- reusable checks -------------------------------------------------------------------

def positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def fraction(v: Any) -> str | None:
    """A fraction in (0, 1]."""
    return None if 0 < v <= 1 else "must be in (0, 1]"


def unit_interval(v: Any) -> str | None:
    return None if 0 <= v <= 1 else "must be in [0, 1]"


def one_of(*choices: str) -> Check:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    return check


# ---- building ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Problem:
    """A cross-field validation failure reported by a profile's ``problems()``."""

    path: str
    reason: str
    got: Any = _MISSING


def build(cls: type, data: Any, *, file: str, path: str = "") -> Any:
    """Build dataclass ``cls`` from a YAML mapping, rejecting unknown keys and bad values."""
    if not isinstance(data, Mapping):
        raise ProfileError(file, path, f"expected a mapping for {cls.__name__}", data)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise ProfileError(file, _join(path, unknown[0]), f"unknown key (known keys: {known})")
    values = {}
    for name, f in fields.items():
        sub = _join(path, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProfileError(file, sub, "required key is missing")
            continue
        parse = f.metadata.get("parse")
        value = parse(data[name], file=file, path=sub) if parse else convert(hints[name], data[name], file=file, path=sub)
        for check in f.metadata.get("checks", ()):
            reason = check(value)
            if reason:
                raise ProfileError(file, sub, reason, data[name])
        values[name] = value
    obj = cls(**values)
    for problem in getattr(obj, "problems", lambda: ())():
        got = problem.got
        raise ProfileError(file, _join(path, problem.path), problem.reason, got)
    return obj


def convert(tp: Any, value: Any, *, file: str, path: str) -> Any:
    """Convert one YAML value to type ``tp`` (int, float, str, bool, Enum, Optional,
    tuple[X, ...], dict[K, V] or a nested dataclass)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(tp, value, file=file, path=path)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, value, file=file, path=path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _convert_enum(tp, value, file=file, path=path)
    if origin is tuple:
        return _convert_tuple(tp, value, file=file, path=path)
    if origin in (dict, Mapping, typing.Mapping) or tp is dict:
        return _convert_mapping(tp, value, file=file, path=path)
    if tp is bool:
        return _convert_bool(value, file=file, path=path)
    if tp is int:
        return _convert_int(value, file=file, path=path)
    if tp is float:
        return _convert_float(value, file=file, path=path)
    if tp is str:
        return _convert_str(value, file=file, path=path)
    raise TypeError(f"unsupported profile field type {tp!r} at {path}")


def _convert_union(tp: Any, value: Any, *, file: str, path: str) -> Any:
    """Only ``Optional[X]`` is supported: None stays None, anything else converts as X."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    inner = [a for a in args if a is not type(None)]
    if len(inner) == 1:
        return convert(inner[0], value, file=file, path=path)
    raise TypeError(f"unsupported union {tp}")


def _convert_dataclass(tp: type, value: Any, *, file: str, path: str) -> Any:
    kind = getattr(tp, "profile_kind", None)
    if kind and isinstance(value, str) and _resolver is not None:
        return _resolver(kind, value, file)  # a reference to another profile by name or path
    if hasattr(tp, "from_yaml_value"):
        return tp.from_yaml_value(value, file=file, path=path)
    return build(tp, value, file=file, path=path)


def _convert_enum(tp: type[enum.Enum], value: Any, *, file: str, path: str) -> Any:
    parse = getattr(tp, "parse", None)
    try:
        return parse(value) if parse else tp(value)
    except (ValueError, TypeError):
        choices = ", ".join(str(m.value) for m in tp)
        raise ProfileError(file, path, f"must be one of {choices}", value) from None


def _convert_tuple(tp: Any, value: Any, *, file: str, path: str) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise ProfileError(file, path, "expected a list", value)
    item = typing.get_args(tp)[0]
    return tuple(convert(item, v, file=file, path=f"{path}[{i}]") for i, v in enumerate(value))


def _convert_mapping(tp: Any, value: Any, *, file: str, path: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ProfileError(file, path, "expected a mapping", value)
    args = typing.get_args(tp)
    kt, vt = args if args else (str, Any)
    out = {}
    for k, v in value.items():
        key = convert(kt, k, file=file, path=_join(path, str(k)))
        out[key] = convert(vt, v, file=file, path=_join(path, str(k)))
    return types.MappingProxyType(out)


def _convert_bool(value: Any, *, file: str, path: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(file, path, "expected true or false", value)
    return value


def _convert_int(value: Any, *, file: str, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(file, path, "expected an integer", value)
    return value


def _convert_float(value: Any, *, file: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(file, path, "expected a number", value)
    return float(value)


def _convert_str(value: Any, *, file: str, path: str) -> str:
    if isinstance(value, bool):  # YAML 1.1 reads unquoted off/on/no/yes as booleans
        raise ProfileError(file, path, "expected a string; YAML reads unquoted off, on, no and yes as "
                           "true/false, so quote it (e.g. \"off\")", value)
    if not isinstance(value, str):
        raise ProfileError(file, path, "expected a string", value)
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
