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

from ..paths import SOURCE_ROOT
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
    """The profiles shipped with SPLASH: ``splash_profiles/`` beside ``splash_core`` where a wheel
    installed them (pyproject.toml maps the one to the other), else ``profiles/`` of the checkout."""
    installed = SOURCE_ROOT / "splash_profiles"
    return installed if installed.is_dir() else SOURCE_ROOT / "profiles"


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
    """Resolve a name or path to a file; FileNotFoundError says what is wrong with a path (missing,
    a folder) or lists the names that exist."""
    profile_class(kind)
    ref = str(ref)
    if ref.endswith((".yaml", ".yml")) or os.sep in ref:
        path = Path(ref)
        if not path.is_absolute() and base_dir is not None and not path.exists():
            path = base_dir / path
        if path.is_dir():
            raise FileNotFoundError(f"{kind} profile {ref}: is a directory, not a file")
        if not path.is_file():
            raise FileNotFoundError(f"{kind} profile {ref}: the file does not exist")
        return path
    folder = _KINDS[kind][0]
    for root in search_roots():
        path = root / folder / f"{ref}.yaml"
        if path.is_file():
            return path
    known = ", ".join(available(kind)) or "none"
    raise FileNotFoundError(f"no {kind} profile named {ref!r} (known {kind} profiles: {known}; or give a path)")


def load(kind: str, ref: Any, base_dir: Path | None = None):
    """Load a profile of ``kind`` from a name, a path, or an already-parsed mapping."""
    if isinstance(ref, dict):
        return from_mapping(kind, ref, file=f"<{kind}>")
    path = find(kind, ref, base_dir)
    return load_file(kind, path)


def load_file(kind: str, path: Path):
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ProfileError(str(path), "(top)", "expected a mapping of keys", data)
    data = dict(data)
    data.setdefault("name", Path(path).stem)
    return from_mapping(kind, data, file=str(path))


def read_yaml(path: Path) -> Any:
    """A YAML file's data; ProfileError for an unreadable file, text that is not UTF-8, invalid
    YAML, a key given twice in one mapping (PyYAML alone keeps the last silently), an alias
    inside its own anchor (data that contains itself) or nesting deeper than Python recurses."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ProfileError(str(path), "(file)", "is a directory, not a file") from None
    except FileNotFoundError:
        raise ProfileError(str(path), "(file)", "the file does not exist") from None
    except OSError as exc:
        raise ProfileError(str(path), "(file)", f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(str(path), "(file)", f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} "
                                                f"at offset {exc.start}") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, "", str(path), set(), set())
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProfileError(str(path), "(yaml)", f"not valid YAML at {where}: {problem}") from None
    except RecursionError:
        raise ProfileError(str(path), "(yaml)", "nested too deeply to read") from None
    finally:
        loader.dispose()


def _check_nodes(node: yaml.Node, path: str, file: str, open_: set[int], done: set[int]) -> None:
    """Reject duplicate keys and aliases that point into their own anchor. ``open_`` holds the
    nodes being walked (an alias to one of them is data containing itself), ``done`` the nodes
    walked already (each node once, however many aliases repeat it)."""
    if id(node) in open_:
        raise ProfileError(file, path or "(top)", "an alias inside its own anchor: the data would contain itself")
    if id(node) in done:
        return
    open_.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_nodes(item, f"{path}[{i}]", file, open_, done)
    elif isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                _check_nodes(value, path, file, open_, done)
                continue
            name = key.value if isinstance(key, yaml.ScalarNode) else f"(key at line {key.start_mark.line + 1})"
            line = key.start_mark.line + 1
            sub = f"{path}.{name}" if path else name
            if name in lines:
                raise ProfileError(file, sub, f"duplicate key {name!r} (lines {lines[name]} and {line})")
            lines[name] = line
            _check_nodes(key, sub, file, open_, done)
            _check_nodes(value, sub, file, open_, done)
    open_.discard(id(node))
    done.add(id(node))


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
