"""What the package may and may not depend on: no benchmark code, no environment knobs for
behaviour, no vendor words, imports that point down; and the transfer options that replaced the
environment knobs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import splash_core
from splash_core.profiles import schema
from splash_core.profiles.loader import load
from splash_core.profiles.transfer import TransferConfig

PACKAGE = Path(splash_core.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
# environment variables the package may read: which plugins load, and the commit a device run records
ALLOWED_ENV = {"SPLASH_BACKENDS", "SPLASH_GIT_COMMIT"}


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts if path.name == "__init__.py" else parts[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def test_the_package_imports_no_benchmark_code():
    offenders = {str(p.relative_to(PACKAGE)): sorted(m for m in _imports(p) if m.split(".")[0] == "splash_bench")
                 for p in SOURCES}
    assert not {k: v for k, v in offenders.items() if v}


def test_no_module_reads_a_splash_environment_knob():
    """Behaviour is typed, validated profile data (the deployment's ``transfer:`` and the rest),
    not environment variables."""
    found = {}
    for path in SOURCES:
        names = set(re.findall(r"SPLASH_[A-Z_]+", path.read_text())) - ALLOWED_ENV
        if names:
            found[str(path.relative_to(PACKAGE))] = sorted(names)
    assert not found


def test_no_vendor_words_in_the_core():
    words = re.compile(r"\b(cuda|nccl|rccl|rocm|hip|nvls)\b|torch\.cuda|ProcessGroupNCCL", re.IGNORECASE)
    found = {str(p.relative_to(PACKAGE)): m.group(0) for p in SOURCES if (m := words.search(p.read_text()))}
    assert not found


# The rooms of splash_core, lowest first: a unit (a top-level module or package) imports only units
# listed before it, function-level imports included (docs/design.md §2 is this map in words).
LAYERS = (
    ("layouts", "dtypes", "formatting", "paths"),  # the vocabulary
    ("profiles",),
    ("results",),
    ("planning",),
    ("platform",),
    ("model",),
    ("reference",),
    ("kernels",),
    ("checkpoint",),
    ("runtime",),
    ("engine",),
    ("studies",),
    ("server",),
    ("report",),
    ("testing",),
    ("cli",),
)
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}
MAX_TOP_LEVEL_MODULES, MAX_LINES, MAX_COMPLEXITY = 10, 400, 20


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "splash_core" and len(parts) > 1 else None


MODULES = {_module_name(p): p for p in SOURCES}


def _edges(texts: dict[str, str] | None = None) -> dict[str, dict[str, int]]:
    """Per module of the package, the modules of the package it imports (anywhere in the file) and
    the line of the first such import; a submodule's import of its own package does not count.
    ``texts``: module name -> source to read instead of the file's."""
    out = {}
    for name, path in MODULES.items():
        tree = ast.parse((texts or {}).get(name) or path.read_text())
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = {}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                targets = [module, *(f"{module}.{a.name}" for a in node.names)]
            for t in targets:
                if t in MODULES and t != name and not name.startswith(t + "."):
                    found.setdefault(t, node.lineno)
        out[name] = found
    return out


def _upward(edges) -> list[str]:
    return [f"{MODULES[a].relative_to(PACKAGE)}:{line} imports {b} ({_unit(a)} may not import {_unit(b)})"
            for a, targets in edges.items() for b, line in targets.items()
            if _unit(a) and _unit(b) and _unit(a) != _unit(b) and RANK[_unit(b)] >= RANK[_unit(a)]]


def _cycles(edges) -> list[str]:
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in edges[node]:
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [])
    return cycles


def test_every_unit_of_the_package_has_a_room():
    units = {_unit(name) for name in MODULES} - {None}
    assert not sorted(units - set(RANK)), "a new top-level module or package: give it a room in LAYERS and docs/design.md"


def test_imports_point_down_the_layers():
    """Every import of another unit, at module or function level, points to a lower room."""
    assert not _upward(_edges())


def test_no_module_imports_itself_back():
    """No cycle among the package's modules, function-level imports included."""
    assert not _cycles(_edges())


def test_the_layering_checks_can_fail():
    """A planted import inside a function, from the vocabulary up to the scheduler (which imports the
    vocabulary back), is an upward import and a cycle."""
    name = "splash_core.layouts"
    planted = MODULES[name].read_text() + "\n\ndef _planted():\n    from .planning import scheduler  # noqa: F401\n"
    edges = _edges({name: planted})
    assert any(line.startswith("layouts.py:") and "splash_core.planning.scheduler" in line for line in _upward(edges))
    assert any(c.startswith(name) or f"-> {name} ->" in c for c in _cycles(edges))


def _oversized(texts: dict[str, str]) -> list[str]:
    """Files of ``texts`` (path -> source) over MAX_LINES lines and functions over MAX_COMPLEXITY
    (McCabe, as radon counts it)."""
    from radon.complexity import cc_visit  # the test extra's

    long = [f"{path}: {n} lines" for path, text in texts.items() if (n := len(text.splitlines())) > MAX_LINES]
    return long + [f"{path}:{block.lineno} {block.fullname}: complexity {block.complexity}"
                   for path, text in texts.items() for block in cc_visit(text) if block.complexity > MAX_COMPLEXITY]


def test_the_package_stays_small_at_every_scale():
    """A few loose top-level modules, small files, simple functions."""
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    assert not _oversized({str(p.relative_to(PACKAGE)): p.read_text() for p in SOURCES})


def test_the_size_check_can_fail():
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(MAX_COMPLEXITY))
    text = f"def tangled(x):\n{branches}    return -1\n"
    assert _oversized({"tangled.py": text}) == [f"tangled.py:1 tangled: complexity {MAX_COMPLEXITY + 1}"]
    assert _oversized({"long.py": "x = 1\n" * (MAX_LINES + 1)}) == [f"long.py: {MAX_LINES + 1} lines"]


def test_transfer_options_default_to_collectives_and_are_validated(tmp_path):
    default = load("deployment", "cpu-tiny").transfer
    assert default == TransferConfig() and default.peer_pulls is False  # pulls are experimental: opt-in
    shipped = Path(splash_core.__file__).parents[1] / "profiles" / "deployments" / "cpu-tiny.yaml"
    path = tmp_path / "d.yaml"
    path.write_text(shipped.read_text() + "transfer: {peer_pulls: true, max_chunks: 2}\n")
    got = load("deployment", str(path)).transfer
    assert got.peer_pulls and got.max_chunks == 2 and got.max_chunks_buffered == TransferConfig().max_chunks_buffered
    for bad, message in (({"max_chunks": 0}, "max_chunks: must be > 0"),
                         ({"min_run_bytes": -1}, "min_run_bytes: must be >= 0"),
                         ({"pulls": True}, "pulls: unknown key")):
        with pytest.raises(schema.ProfileError, match=message):
            schema.build(TransferConfig, bad, file="x.yaml", path="transfer")
