"""The distribution a user installs: named ``splash-serve`` (``splash`` on the package index is
another project) with every plugin depending on that name, compatible ranges rather than exact
pins of libraries other tools share, no dependency nothing imports, the test-only dummy backend
left out of the user's install, and a conformance suite that says in one line when pytest is
missing."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = sorted(ROOT.glob("backends/*/pyproject.toml")) + [ROOT / "tests/plugins/dummy/pyproject.toml"]
SHARED = ("pluggy", "pyyaml", "pytest", "numpy", "matplotlib", "safetensors", "tqdm", "triton")


def project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def requirement_name(spec: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", spec)[0].lower().replace("_", "-")


def test_the_distribution_and_every_plugin_use_the_name_splash_serve():
    main = project(ROOT / "pyproject.toml")
    assert main["name"] == "splash-serve"
    assert metadata.distribution("splash-serve").entry_points.select(group="console_scripts")["splash"].value \
        == "splash_core.cli.main:main"
    for path in PLUGINS:
        names = [requirement_name(d) for d in project(path)["dependencies"]]
        assert "splash-serve" in names and "splash" not in names, path


def test_shared_libraries_take_ranges_and_every_declared_dependency_is_imported():
    main = project(ROOT / "pyproject.toml")
    specs = main["dependencies"] + [d for extra in main["optional-dependencies"].values() for d in extra]
    for spec in specs:
        if requirement_name(spec) in SHARED:
            assert "==" not in spec and "<" in spec and ">=" in spec, spec
    sources = "\n".join(p.read_text() for p in [*ROOT.glob("splash_core/**/*.py"), *ROOT.glob("tests/*.py"),
                                                *ROOT.glob("backends/*/*/*.py"), *ROOT.glob("bench/**/*.py"),
                                                *_bench_serving_sources()])
    modules = {"pyyaml": "yaml", "pytest": "pytest", "ipython": "IPython", "pillow": "PIL"}
    for spec in specs:
        name = requirement_name(spec)
        if name == main["name"]:  # an extra that names another extra of this distribution
            continue
        module = modules.get(name, name.replace("-", "_"))
        assert re.search(rf"^\s*(import|from) {module}\b", sources, re.M), f"{name} is declared but never imported"


def _bench_serving_sources() -> list[Path]:
    """sglang's files on the import path of ``sglang.bench_serving``, whose needs the [bench] extra
    lists (sglang itself is installed with --no-deps: its own requirements are GPU-only)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.fail("sglang is not installed: pip install --no-deps sglang==0.5.9 (README, the test set-up)")
    root = Path(spec.origin).parent
    return [root / "bench_serving.py", root / "utils.py"]


def test_the_users_install_leaves_the_dummy_backend_out():
    main = project(ROOT / "pyproject.toml")
    declared = main["dependencies"] + [d for extra in main["optional-dependencies"].values() for d in extra]
    assert not [d for d in declared if "dummy" in d]
    # tests/plugins/dummy is a distribution of its own: the wheel holds splash_core and the profiles
    # only (tests/test_cli_package_wheel.py builds it)
    assert "find_packages(include=[\"splash_core\", \"splash_core.*\"])" in (ROOT / "setup.py").read_text()
    ours = metadata.distribution("splash-serve").entry_points.select(group="splash")
    assert [ep.name for ep in ours] == ["reference"]
    assert main["optional-dependencies"]["conformance"] == ["pytest>=8,<10"]


def test_the_conformance_suite_without_pytest_says_so_in_one_line():
    code = ("import runpy, sys; sys.modules['pytest'] = None; sys.argv = ['x', '--backend', 'reference']; "
            "runpy.run_module('splash_core.testing', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr == ("python -m splash_core.testing: error: the conformance suite runs under pytest, which is "
                           "not installed: pip install 'splash-serve[conformance]'\n")
