"""The wheel a user installs: it ships every profile (``splash_profiles``, found by the loader when
installed), every module of ``splash_core``, ``py.typed`` and the LICENSE, nothing else at the
top level (the test-only dummy backend stays out); matplotlib only in the ``report`` extra; and
the backends require the core of their own release. The wheel is built here (pure Python: a few
seconds) and, unpacked on an import path of its own, serves ``splash profiles show``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from splash_core import __version__

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "splash_core", "profiles")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    setuptools = next(Requirement(r) for r in required if r.startswith("setuptools"))
    if not setuptools.specifier.contains(metadata.version("setuptools")):
        pytest.skip(f"the wheel is built with this environment's setuptools, which is older than {setuptools}")
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:  # built from a copy: the build's own folders stay out of the checkout
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           str(source), "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (path,) = out.glob("splash_serve-*.whl")
    with zipfile.ZipFile(path) as z:
        yield z


def test_the_wheel_ships_every_profile_module_and_the_license(wheel):
    names = set(wheel.namelist())
    profiles = sorted(p.relative_to(ROOT / "profiles").as_posix() for p in (ROOT / "profiles").rglob("*.yaml"))
    assert len(profiles) > 20 and "deployments/cpu-tiny.yaml" in profiles
    assert sorted(n.removeprefix("splash_profiles/") for n in names if n.endswith(".yaml")) == profiles
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "splash_core").rglob("*.py")}
    assert not modules - names, "modules missing from the wheel"
    assert "splash_core/py.typed" in names
    dist_info = f"splash_serve-{__version__}.dist-info"
    assert wheel.read(f"{dist_info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in (ROOT / "LICENSE").read_bytes()[:200]
    assert {n.split("/")[0] for n in names} == {"splash_core", "splash_profiles", dist_info}


def test_matplotlib_is_only_in_the_report_extra(wheel):
    metadata = Parser().parsestr(wheel.read(f"splash_serve-{__version__}.dist-info/METADATA").decode())
    plotting = [Requirement(r) for r in metadata.get_all("Requires-Dist") if r.startswith("matplotlib")]
    assert [str(r.marker) for r in plotting] == ['extra == "report"']
    assert "report" in metadata.get_all("Provides-Extra")


def test_installed_from_the_wheel_splash_finds_its_profiles(wheel, tmp_path):
    site = tmp_path / "site"
    wheel.extractall(site)  # what pip installs of a pure-Python wheel: its files on the import path
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import splash_core; "
            "assert splash_core.__file__.startswith(sys.argv[1]), splash_core.__file__; "
            "from splash_core.profiles.loader import builtin_root; print(builtin_root()); "
            "from splash_core.cli.main import main; sys.exit(main(['profiles', 'show', 'deployment', 'cpu-tiny']))")
    done = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    root, shown = done.stdout.split("\n", 1)
    assert root == str(site / "splash_profiles")
    assert "cpu-tiny" in shown


def test_the_backends_require_the_core_of_their_release():
    for path in sorted(ROOT.glob("backends/*/pyproject.toml")):
        project = tomllib.loads(path.read_text())["project"]
        for spec in project["dependencies"]:
            requirement = Requirement(spec)
            if requirement.name.startswith("splash-"):
                own = __version__ if requirement.name == "splash-serve" else project["version"]
                assert requirement.specifier.contains(own), (path, spec)
                assert re.search(r"<\s*\d", str(requirement.specifier)), f"{path}: {spec} has no upper bound"
                assert not requirement.specifier.contains(f"{int(own.split('.')[0])}.{int(own.split('.')[1]) + 1}.0")
