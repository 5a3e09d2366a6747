"""Plugin loading and backend selection: the external dummy package through its entry point,
fakes registered per registry, broken plugins reported by name without hiding the others,
``auto`` and ``SPLASH_BACKENDS``; and docs/plugins.md kept in step with hookspecs.py."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

from splash_core.cli.main import main
from splash_core.platform import hookspecs, plugins
from splash_core.platform.backend import Backend
from splash_core.platform.interfaces import BackendInfo

DOCS = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


# Backends these tests may see: the reference, the dummy package and the fakes below. The
# allow-list keeps the accelerator backends installed on a GPU machine out of their way.
FAKES = ("acme", "typo", "badargs", "good", "liar", "off", "acc", "cpu-only", "generic", "tuned", "acc-a", "acc-b")


@pytest.fixture(autouse=True)
def only_test_backends(monkeypatch):
    monkeypatch.setenv(plugins.ALLOW_ENV, ",".join(("reference", "dummy", *FAKES)))


def fake(name, *, accelerator=True, reason=None, specializes=None, **hooks):
    """A plugin object answering the two required hooks, plus any ``hooks`` given."""
    hooks = {
        "splash_backend_info": lambda: BackendInfo(name, "9.9", f"fake {name}", "cpu", accelerator, specializes),
        "splash_backend_check": lambda: reason,
        **hooks,
    }
    # a fresh class per fake: plugins must be hashable, hooks plain functions
    return type(f"Fake_{name}", (), {hook: staticmethod(fn) for hook, fn in hooks.items()})()


# ---- the external dummy package ------------------------------------------------------------

def test_dummy_is_found_through_its_entry_point():
    registry = plugins.load()
    assert "dummy" in registry.plugins, registry.describe()
    assert registry.origins["dummy"].startswith("splash-backend-dummy")
    status = {s.name: s for s in registry.statuses()}["dummy"]
    assert not status.available and "SPLASH_DUMMY_AVAILABLE" in status.reason


def test_backends_json_lists_the_dummy(capsys):
    assert main(["backends", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by_name = {b["name"]: b for b in out["backends"]}
    assert by_name["dummy"]["origin"].startswith("splash-backend-dummy")
    assert by_name["dummy"]["available"] is False
    assert by_name["reference"]["available"] is True
    assert out["auto"] == "reference"  # an unusable accelerator backend never wins auto


def test_enabled_dummy_wins_auto_and_falls_back_to_reference(monkeypatch):
    monkeypatch.setenv("SPLASH_DUMMY_AVAILABLE", "1")
    registry = plugins.load()
    assert plugins.select(registry, "auto") == "dummy"
    backend = Backend(registry, "dummy")
    assert backend.chain == ["dummy", "reference"]
    assert backend.process_group_backend() == "gloo" and backend.hardware_profile() == "cpu"
    assert str(backend.device(0)) == "cpu"  # unanswered by the dummy: the reference answers


# ---- broken plugins ------------------------------------------------------------------------

def test_broken_plugins_are_named_and_do_not_hide_the_others(monkeypatch):
    def missing_dependency():
        raise ImportError("No module named 'acme_kernels'")

    real = plugins._entry_points
    monkeypatch.setattr(plugins, "_entry_points",
                        lambda: [*real(), ("acme", "acme-backend 1.0", missing_dependency)])
    registry = plugins.load(extra=[
        ("typo", fake("typo", splash_make_colectives=lambda group, device: None)),
        ("badargs", fake("badargs", splash_make_collectives=lambda grp: None)),
        ("good", fake("good")),
    ])
    broken = {name: s.reason for name, s in registry.broken.items()}
    assert broken["acme"].startswith("import failed: ImportError: No module named 'acme_kernels'")
    assert "unknown hook splash_make_colectives (did you mean splash_make_collectives?)" in broken["typo"]
    assert broken["badargs"].startswith("invalid hook") and "grp" in broken["badargs"]
    assert set(registry.plugins) == {"reference", "dummy", "good"}
    listed = {s.name: s for s in registry.statuses()}
    assert listed["typo"].broken and not listed["good"].broken
    with pytest.raises(plugins.BackendError, match="backend 'typo' is broken: unknown hook"):
        plugins.select(registry, "typo")
    assert plugins.select(registry, "good") == "good"


def test_backends_cli_shows_a_broken_plugin(monkeypatch, capsys):
    def boom():
        raise RuntimeError("vendor SDK not found")

    real = plugins._entry_points
    monkeypatch.setattr(plugins, "_entry_points", lambda: [*real(), ("acme", "acme-backend 1.0", boom)])
    assert main(["backends", "--json"]) == 0
    by_name = {b["name"]: b for b in json.loads(capsys.readouterr().out)["backends"]}
    assert by_name["acme"]["broken"] and "vendor SDK not found" in by_name["acme"]["reason"]
    assert by_name["reference"]["available"]


def test_info_with_the_wrong_name_is_broken():
    registry = plugins.load(extra=[("liar", fake("somebody-else"))])
    assert "liar" not in registry.plugins
    assert "must return BackendInfo(name='liar'" in registry.broken["liar"].reason


def test_fakes_live_in_their_own_registry():
    with_fake = plugins.load(extra=[("good", fake("good"))])
    assert "good" in with_fake.plugins
    with_fake.pm.unregister(name="good")
    assert with_fake.pm.get_plugin("good") is None
    assert "good" not in plugins.load().plugins  # registering never leaks into a new registry


# ---- selection -------------------------------------------------------------------------------

def test_selection_by_name():
    registry = plugins.load(extra=[("off", fake("off", reason="no device of this kind"))])
    assert plugins.select(registry, "reference") == "reference"
    with pytest.raises(plugins.BackendError, match="not usable here: no device of this kind"):
        plugins.select(registry, "off")
    with pytest.raises(plugins.BackendError) as info:
        plugins.select(registry, "nope")
    assert "no backend named 'nope'" in str(info.value) and "reference (builtin): available" in str(info.value)


def test_auto_prefers_a_usable_accelerator_backend():
    registry = plugins.load(extra=[("off", fake("off", reason="no device")), ("acc", fake("acc"))])
    assert plugins.select(registry, "auto") == "acc"
    registry = plugins.load(extra=[("off", fake("off", reason="no device")),
                                   ("cpu-only", fake("cpu-only", accelerator=False))])
    assert plugins.select(registry, "auto") == "reference"


def test_auto_takes_the_more_specific_backend():
    registry = plugins.load(extra=[("generic", fake("generic")), ("tuned", fake("tuned", specializes="generic"))])
    assert plugins.select(registry, "auto") == "tuned"
    assert Backend(registry, "tuned").chain == ["tuned", "generic", "reference"]


def test_auto_with_two_unrelated_claimants_names_both():
    registry = plugins.load(extra=[("acc-a", fake("acc-a")), ("acc-b", fake("acc-b"))])
    with pytest.raises(plugins.BackendError, match="acc-a and acc-b both claim this machine"):
        plugins.select(registry, "auto")


def test_allow_list(monkeypatch):
    monkeypatch.setenv("SPLASH_BACKENDS", "reference,acc-a")
    registry = plugins.load(extra=[("acc-a", fake("acc-a")), ("acc-b", fake("acc-b"))])
    assert set(registry.plugins) == {"reference", "acc-a"}
    assert plugins.select(registry, "auto") == "acc-a"
    monkeypatch.setenv("SPLASH_BACKENDS", "dummy")
    registry = plugins.load()
    assert set(registry.plugins) == {"dummy"}
    with pytest.raises(plugins.BackendError, match="no usable backend"):
        plugins.select(registry, "auto")


# ---- the vendor's guide keeps up with the hook specifications ------------------------------------

def _specs():
    return {name: getattr(hookspecs, name) for name in dir(hookspecs) if name.startswith("splash_")}


def test_every_hook_is_documented_with_its_signature_and_firstresult():
    text = DOCS.read_text()
    sections = dict(re.findall(r"^### `(splash_\w+\([^)]*\))`\n(.*?)(?=^### |^## |\Z)", text, re.M | re.S))
    documented = {sig.split("(")[0]: (sig, body) for sig, body in sections.items()}
    assert set(documented) == set(_specs()), "docs/plugins.md and hookspecs.py list different hooks"
    for name, spec in _specs().items():
        sig, body = documented[name]
        assert sig == f"{name}{inspect.signature(spec)}", sig
        firstresult = spec.splash_spec["firstresult"]
        assert f"firstresult: {'yes' if firstresult else 'no'}" in body, name


def test_guide_gives_the_conformance_command():
    text = DOCS.read_text()
    assert "python -m pytest --pyargs splash_core.testing --splash-backend" in text
    assert "[project.entry-points.splash]" in text
