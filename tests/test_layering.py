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


@pytest.mark.parametrize("module, forbidden", [
    ("profiles/scenario.py", ("splash_core.capacity", "splash_core.timing_law")),
    ("engine/summary.py", ("splash_core.cli",)),
])
def test_imports_point_down(module, forbidden):
    imported = _imports(PACKAGE / module)
    assert not [m for m in imported if m.startswith(forbidden)]


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
