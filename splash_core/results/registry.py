"""Which benchmark's results have which :class:`~splash_core.results.shapes.Shape`: the
mappings the entry points of group ``splash.result_shapes`` name.

Each entry point names a mapping of benchmark name -> Shape. The core registers the shapes of
the results its own commands write (``splash_core.studies.result_shapes``), the bench
distribution those of its programs (``splash_bench.shapes.*``); a new benchmark registers its
shape from its own distribution's pyproject.toml, with no change here (docs/results.md)::

    [project.entry-points."splash.result_shapes"]
    my_bench = "my_package.result_shapes:SHAPES"

Entry points keep this room below the ones that own shapes: it imports none of them, and
splash_core imports no benchmark code. They are loaded lazily, once, when the first result is
checked. An entry point that cannot be used (it fails to import, or names no mapping of names
to well-formed shapes) and a benchmark name registered twice are errors naming the entry
points, never skipped: a skipped shape would let its benchmark's malformed results through.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from .shapes import Shape, shape_problem

GROUP = "splash.result_shapes"


class ShapeRegistryError(RuntimeError):
    """An entry point of :data:`GROUP` that cannot be used, or one benchmark name registered twice."""


@dataclasses.dataclass(frozen=True)
class Registry:
    """Every registered shape, and which entry point registered it (in words, for errors)."""

    shapes: Mapping[str, Shape]
    origins: Mapping[str, str]


def collect(entry_points: Iterable[Any]) -> Registry:
    """The shapes of ``entry_points`` (``importlib.metadata.EntryPoint``-like: ``name``,
    ``value``, ``load()``, maybe ``dist``); :class:`ShapeRegistryError` names a broken one,
    or both registrations of a benchmark registered twice."""
    shapes: dict[str, Shape] = {}
    origins: dict[str, str] = {}
    for ep in entry_points:
        origin = _describe(ep)
        for name, shape in _load(ep, origin).items():
            # the very same object twice is one registration (a distribution seen twice on the path)
            if name in shapes and shapes[name] is not shape:
                raise ShapeRegistryError(f"the result shape of benchmark {name!r} is registered twice: by "
                                         f"{origins[name]} and by {origin}; a benchmark name has one shape")
            shapes[name] = shape
            origins.setdefault(name, origin)
    return Registry(MappingProxyType(shapes), MappingProxyType(origins))


def _describe(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    owner = f" of {dist.name} {dist.version}" if dist is not None else ""
    return f"{GROUP} entry point {ep.name!r} ({ep.value}){owner}"


def _load(ep: Any, origin: str) -> Mapping[str, Shape]:
    """The mapping ``ep`` names, each name and shape checked."""
    try:
        mapping = ep.load()
    except Exception as exc:  # whatever the import raised, the error must name the entry point
        raise ShapeRegistryError(f"{origin} failed to load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(mapping, Mapping):
        raise ShapeRegistryError(f"{origin} names a {type(mapping).__name__}, not a mapping of benchmark "
                                 f"names to Shapes")
    for name, shape in mapping.items():
        if not isinstance(name, str) or not name.strip():
            raise ShapeRegistryError(f"{origin}: benchmark name {name!r} must be a non-empty string")
        problem = shape_problem(shape)
        if problem:
            raise ShapeRegistryError(f"{origin}: the shape of {name!r} {problem}")
    return mapping


def _listed() -> Iterable[Any]:
    """The installed entry points of :data:`GROUP` (tests plant their own by replacing this)."""
    return importlib.metadata.entry_points(group=GROUP)


@functools.cache
def installed() -> Registry:
    """The shapes the installed distributions register, loaded on first use (``installed.cache_clear()``
    forgets them, for a test that plants entry points)."""
    return collect(_listed())


def shape_of(benchmark: str) -> Shape | None:
    """The registered shape of ``benchmark``'s results, or None (its results get the envelope checks only)."""
    return installed().shapes.get(benchmark)
