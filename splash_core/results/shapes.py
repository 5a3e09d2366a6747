"""The shape of one benchmark's ``summary`` and ``samples``, and its checker (contract: docs/results.md).

A :class:`Shape` holds the keys a benchmark's ``summary`` holds, the fields of each row of its
row lists, and the fields every raw sample carries, each with a kind of
:mod:`splash_core.results.kinds`. :func:`shape_error` is called by
:func:`splash_core.results.validate` with the shape the benchmark registered
(:mod:`splash_core.results.registry`), so a writer learns of a mistake when it writes, and the
report never guesses. Results of a benchmark without a registered shape pass with the envelope
checks alone; the report lists them as "no renderer".

Summary keys are checked strictly (an unknown key is an error: it is most often a typo);
samples must carry their listed fields and may carry more (run index, rank ...).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .kinds import CONTAINERS, KINDS


@dataclasses.dataclass(frozen=True)
class Shape:
    """What one benchmark's ``summary`` and ``samples`` hold.

    ``summary`` maps each summary key to a kind, or to a container of objects whose fields
    ``rows[key]`` lists: ``"rows"`` a non-empty list of them, ``"named"`` a non-empty object of
    names to them, ``"record"`` one of them; ``row_key`` names the fields that identify a row of
    a list (no two rows may share them). ``summary_names``, when set, is the kind of every
    summary value of a benchmark whose summary keys are names the writer chooses (backends, say)
    rather than fixed keys. ``check_samples(summary, samples, where)`` checks that the summary
    agrees with the samples it was computed from; ``check(summary, where)`` checks what the
    fields' kinds cannot (a field required by another's value, say). ``sample`` lists the fields
    of each raw sample. ``measured_only`` are row fields (listed without ``?``) required in measured
    results, optional in paper and model ones. ``sources`` are the provenance values allowed
    (predictions are never "measured").
    """

    doc: str
    summary: Mapping[str, str]
    rows: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    row_key: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    sample: Mapping[str, str] = dataclasses.field(default_factory=dict)
    measured_only: frozenset[str] = frozenset()
    sources: frozenset[str] = frozenset({"measured", "paper"})
    check: Callable[[dict, str], str | None] | None = None
    summary_names: str = ""
    check_samples: Callable[[dict, list, str], str | None] | None = None


def _check_value(value: Any, kind: str, where: str) -> str | None:
    test, description = KINDS[kind.rstrip("?")]
    if not test(value):
        return f"{where}: must be {description} (got {value!r})"
    return None


def _check_object(obj: Any, fields: Mapping[str, str], where: str, *, strict: bool,
                  optional: frozenset[str] = frozenset()) -> str | None:
    if not isinstance(obj, dict):
        return f"{where}: must be an object (got {type(obj).__name__})"
    for name, kind in fields.items():
        if name not in obj:
            if kind.endswith("?") or name in optional:
                continue
            return f"{where}: missing field {name!r}"
        if kind.rstrip("?") not in CONTAINERS:
            error = _check_value(obj[name], kind, f"{where}.{name}")
            if error:
                return error
    if strict:
        unknown = sorted(set(obj) - set(fields))
        if unknown:
            return f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(fields)})"
    if "src" in fields and "dst" in fields and obj.get("src") == obj.get("dst"):
        return f"{where}: src and dst must differ (got {obj.get('src')!r} twice)"
    return None


def shape_error(data: dict, shape: Shape, where: str) -> str | None:
    """The first way ``data`` breaks ``shape`` (its benchmark's), as 'file: field.path: what', or None."""
    if data["source"] not in shape.sources:
        return (f"{where}: source: {data['benchmark']} results must be {' or '.join(sorted(shape.sources))}"
                f" (got {data['source']!r})")
    measured = data["source"] == "measured"
    summary = data["summary"]
    if shape.summary_names:
        error = _check_names(summary, shape.summary_names, f"{where}: summary")
    else:
        error = _check_object(summary, shape.summary, f"{where}: summary", strict=True)
    if error:
        return error
    optional = frozenset() if measured else shape.measured_only
    for key, fields in shape.rows.items():
        if key in summary:  # a container marked optional may be absent
            error = _check_container(shape, key, summary[key], fields, f"{where}: summary.{key}", optional)
            if error:
                return error
    if shape.check:
        error = shape.check(summary, f"{where}: summary")
        if error:
            return error
    for i, sample in enumerate(data["samples"]):
        if shape.sample:
            error = _check_object(sample, shape.sample, f"{where}: samples[{i}]", strict=False)
            if error:
                return error
    if shape.check_samples:
        return shape.check_samples(summary, data["samples"], where)
    return None


def _check_container(shape: Shape, key: str, value: Any, fields: Mapping[str, str], where: str,
                     optional: frozenset[str]) -> str | None:
    """One ``rows``, ``named`` or ``record`` summary value: its objects, each strictly."""
    container = shape.summary[key].rstrip("?")
    if container == "record":
        return _check_object(value, fields, where, strict=True, optional=optional)
    if container == "named":
        if not isinstance(value, dict) or not value:
            return f"{where}: must be a non-empty object of names to objects"
        for name, obj in value.items():
            error = _check_object(obj, fields, f"{where}[{json.dumps(name)}]", strict=True, optional=optional)
            if error:
                return error
        return None
    if not isinstance(value, list) or not value:
        return f"{where}: must be a non-empty list of objects"
    seen: dict[tuple, int] = {}
    for i, row in enumerate(value):
        error = _check_object(row, fields, f"{where}[{i}]", strict=True, optional=optional)
        if error:
            return error
        ident = tuple(row.get(f) for f in shape.row_key.get(key, ()))
        if ident and ident in seen:
            return f"{where}[{i}]: repeats row {seen[ident]} ({ident})"
        seen[ident] = i
    return None


def _check_names(obj: Any, kind: str, where: str) -> str | None:
    """A summary keyed by names the writer chose, every value of ``kind``."""
    if not isinstance(obj, dict) or not obj:
        return f"{where}: must be a non-empty object of names to {KINDS[kind][1]}"
    for name, value in obj.items():
        error = _check_value(value, kind, f"{where}.{name}")
        if error:
            return error
    return None


def shape_problem(shape: Any) -> str | None:
    """The first way ``shape`` itself is malformed, or None: not a :class:`Shape`, a kind that
    does not exist, a container outside ``summary``, a container without its listed fields or
    fields listed for a key that is no container. The registry asks before it accepts a shape,
    so a misspelt kind is named where it is registered rather than when a result is checked."""
    if not isinstance(shape, Shape):
        return f"is a {type(shape).__name__}, not a Shape"
    fields = [*shape.sample.values(), *(k for f in shape.rows.values() for k in f.values())]
    fields += [shape.summary_names] if shape.summary_names else []
    for kind in [*shape.summary.values(), *fields]:
        if kind.rstrip("?") not in KINDS and kind.rstrip("?") not in CONTAINERS:
            return f"uses the unknown kind {kind!r} (kinds: {', '.join(KINDS)}; containers: {', '.join(CONTAINERS)})"
    misplaced = [k for k in fields if k.rstrip("?") in CONTAINERS]
    if misplaced:
        return f"uses the container {misplaced[0]!r} outside summary (containers hold objects of summary)"
    containers = {key for key, kind in shape.summary.items() if kind.rstrip("?") in CONTAINERS}
    if containers != set(shape.rows):
        odd = sorted(containers ^ set(shape.rows))[0]
        return f"summary key {odd!r}: a container must list its fields in rows, and only a container may"
    return None
