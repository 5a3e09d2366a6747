"""Find and load profiles by name or path; every kind is a frozen dataclass.

A reference is a path to a ``.yaml`` file (a profile's references to others may be relative
to its own folder) or the name of a profile shipped with SPLASH.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import yaml

from . import schema
from .schema import ProfileError

# kind -> (folder, "module:Class"); modules are imported on first use.
_KINDS: dict[str, tuple[str, str]] = {
    "hardware": ("hardware", "splash_core.profiles.hardware:HardwareProfile"),
    "model": ("models", "splash_core.profiles.model:ModelProfile"),
    "deployment": ("deployments", "splash_core.profiles.deployment:DeploymentProfile"),
    "scenario": ("scenarios", "splash_core.profiles.scenario:ScenarioProfile"),
    "workload": ("workloads", "splash_core.profiles.workload:WorkloadProfile"),
}


def kinds() -> tuple[str, ...]:
    return tuple(_KINDS)


def profile_class(kind: str) -> type:
    try:
        _, target = _KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown profile kind {kind!r}; expected one of {', '.join(_KINDS)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def builtin_root() -> Path:
    """The profiles shipped with SPLASH (``profiles/`` of the source tree)."""
    return Path(__file__).resolve().parents[2] / "profiles"


def search_roots() -> list[Path]:
    return [builtin_root()]


def available(kind: str) -> list[str]:
    """Names of the profiles of one kind on the search path."""
    folder = _KINDS[kind][0]
    names: set[str] = set()
    for root in search_roots():
        names.update(p.stem for p in (root / folder).glob("*.yaml"))
    return sorted(names)


def find(kind: str, ref: str, base_dir: Path | None = None) -> Path:
    """Resolve a name or path to a file; FileNotFoundError lists what exists."""
    profile_class(kind)
    ref = str(ref)
    candidates = []
    if ref.endswith((".yaml", ".yml")) or os.sep in ref:
        path = Path(ref)
        if not path.is_absolute() and base_dir is not None and not path.exists():
            path = base_dir / path
        candidates.append(path)
    else:
        folder = _KINDS[kind][0]
        candidates += [root / folder / f"{ref}.yaml" for root in search_roots()]
    for path in candidates:
        if path.is_file():
            return path
    known = ", ".join(available(kind)) or "none"
    raise FileNotFoundError(f"no {kind} profile {ref!r} (known {kind} profiles: {known})")


def load(kind: str, ref: Any, base_dir: Path | None = None):
    """Load a profile of ``kind`` from a name, a path, or an already-parsed mapping."""
    if isinstance(ref, dict):
        return from_mapping(kind, ref, file=f"<{kind}>")
    path = find(kind, ref, base_dir)
    return load_file(kind, path)


def load_file(kind: str, path: Path):
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ProfileError(str(path), "(file)", f"cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProfileError(str(path), "(yaml)", f"not valid YAML at {where}: {problem}") from None
    if not isinstance(data, dict):
        raise ProfileError(str(path), "(top)", "expected a mapping of keys", data)
    data = dict(data)
    data.setdefault("name", Path(path).stem)
    return from_mapping(kind, data, file=str(path))


def from_mapping(kind: str, data: dict, *, file: str):
    cls = profile_class(kind)
    data = dict(data)
    declared = data.pop("kind", kind)
    if declared != kind:
        raise ProfileError(file, "kind", f"expected a {kind} profile", declared)
    return schema.build(cls, data, file=file)


def _resolve_reference(kind: str, ref: str, referring_file: str):
    base = Path(referring_file).parent if not referring_file.startswith("<") else None
    try:
        return load(kind, ref, base)
    except FileNotFoundError as exc:
        raise ProfileError(referring_file, kind, str(exc)) from None


schema.set_reference_resolver(_resolve_reference)
