"""Load backend plugins and select one (docs/design.md §4).

Built-in backends are loaded exactly like external ones (an import path resolved to a
plugin object), then the entry points of group ``splash``. A plugin that fails to import,
declares an unknown ``splash_*`` hook or has a hook with wrong arguments is recorded as
broken with the reason; it never hides the others.

``SPLASH_BACKENDS`` (comma-separated names) restricts which plugins are loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import os
import traceback
from typing import Any, Callable, Iterable

import pluggy

from . import hookspecs
from .interfaces import BackendInfo

GROUP = "splash"
ALLOW_ENV = "SPLASH_BACKENDS"
BUILTIN = {"reference": "splash_core.reference.plugin"}


class BackendError(RuntimeError):
    """No usable backend, an unknown name, or an ambiguous ``auto``; the message lists what
    is installed and why each unusable one is unusable."""


@dataclasses.dataclass(frozen=True)
class BackendStatus:
    """One installed plugin as ``splash backends`` shows it."""

    name: str
    version: str
    summary: str
    available: bool
    reason: str  # why not available ("" when available)
    origin: str  # "builtin" or the distribution that registered it
    info: BackendInfo | None = None
    broken: bool = False


@dataclasses.dataclass
class Registry:
    """The plugin manager plus what loading found."""

    pm: pluggy.PluginManager
    plugins: dict[str, Any]
    origins: dict[str, str]
    broken: dict[str, BackendStatus]

    def info(self, name: str) -> BackendInfo:
        return _call_one(self, name, "splash_backend_info")

    def check(self, name: str) -> str | None:
        """None if usable, else the reason."""
        try:
            return _call_one(self, name, "splash_backend_check")
        except Exception as exc:  # a check that raises is a broken check, not a crash
            return f"availability check raised {type(exc).__name__}: {exc}"

    def statuses(self) -> list[BackendStatus]:
        out = []
        for name in self.plugins:
            try:
                info = self.info(name)
            except Exception as exc:
                out.append(BackendStatus(name, "?", "", False, f"splash_backend_info raised {exc!r}",
                                         self.origins[name], broken=True))
                continue
            reason = self.check(name)
            out.append(BackendStatus(name, info.version, info.summary, reason is None, reason or "",
                                     self.origins[name], info))
        out.extend(self.broken.values())
        return sorted(out, key=lambda s: (s.name != "reference", s.name))

    def describe(self) -> str:
        """Every installed backend and whether it is usable, on one line (errors stay one line)."""
        rows = []
        for s in self.statuses():
            state = "available" if s.available else f"unavailable: {s.reason}"
            rows.append(f"{s.name} ({s.origin}): {state}")
        return "installed backends: " + "; ".join(rows)


class _Manager(pluggy.PluginManager):
    """Like pytest's: any callable named ``splash_*`` is a hook implementation, marked or not,
    so a misspelt hook is reported instead of silently ignored."""

    def parse_hookimpl_opts(self, plugin, name):
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("splash_") and callable(getattr(plugin, name, None)):
            return {"wrapper": False, "hookwrapper": False, "optionalhook": False,
                    "tryfirst": False, "trylast": False, "specname": None}
        return opts


def _call_one(registry: Registry, name: str, hook: str, **kwargs):
    others = [p for n, p in registry.plugins.items() if n != name]
    caller = registry.pm.subset_hook_caller(hook, remove_plugins=others)
    result = caller(**kwargs)
    if hook == "splash_backend_info":
        return result[0] if result else None
    return result


def _allowed() -> set[str] | None:
    raw = os.environ.get(ALLOW_ENV, "").strip()
    return {n.strip() for n in raw.split(",") if n.strip()} if raw else None


def _entry_points() -> Iterable[tuple[str, str, Callable[[], Any]]]:
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        origin = f"{dist.name} {dist.version}" if dist is not None else ep.value
        yield ep.name, origin, ep.load


def load(extra: Iterable[tuple[str, Any]] = (), entry_points: bool = True) -> Registry:
    """Build a registry: built-ins, then entry points, then ``extra`` (name, plugin) pairs
    (tests register fakes this way)."""
    pm = _Manager(GROUP)
    pm.add_hookspecs(hookspecs)
    registry = Registry(pm, {}, {}, {})
    allowed = _allowed()
    sources: list[tuple[str, str, Callable[[], Any]]] = [
        (name, "builtin", lambda path=path: importlib.import_module(path)) for name, path in BUILTIN.items()
    ]
    if entry_points:
        sources += [s for s in _entry_points() if s[0] not in BUILTIN]
    sources += [(name, "registered", lambda p=plugin: p) for name, plugin in extra]
    for name, origin, loader in sources:
        if allowed is not None and name not in allowed:
            continue
        if name in registry.plugins or name in registry.broken:
            continue
        _register(registry, name, origin, loader)
    return registry


def _register(registry: Registry, name: str, origin: str, loader: Callable[[], Any]) -> None:
    def broken(reason: str) -> None:
        registry.broken[name] = BackendStatus(name, "?", "", False, reason, origin, broken=True)

    try:
        plugin = loader()
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        broken(f"import failed: {type(exc).__name__}: {exc} ({last.filename}:{last.lineno})")
        return
    try:
        registry.pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        broken(f"invalid hook: {exc}")
        return
    unknown = [
        hook.name for hook in registry.pm.get_hookcallers(plugin) or [] if hook.spec is None
    ]
    if unknown:
        registry.pm.unregister(plugin)
        specs = [n for n in dir(hookspecs) if n.startswith("splash_")]
        hints = []
        for hook in unknown:
            close = difflib.get_close_matches(hook, specs, n=1)
            hints.append(f"{hook}" + (f" (did you mean {close[0]}?)" if close else ""))
        broken("unknown hook " + ", ".join(hints))
        return
    registry.plugins[name] = plugin
    registry.origins[name] = origin
    try:
        info = registry.info(name)
    except Exception as exc:
        registry.pm.unregister(plugin)
        del registry.plugins[name], registry.origins[name]
        broken(f"splash_backend_info raised {type(exc).__name__}: {exc}")
        return
    if not isinstance(info, BackendInfo) or info.name != name:
        registry.pm.unregister(plugin)
        del registry.plugins[name], registry.origins[name]
        broken(f"splash_backend_info must return BackendInfo(name={name!r}, ...), got {info!r}")


def select(registry: Registry, name: str = "auto") -> str:
    """Pick a backend by name or ``auto``; BackendError explains any failure."""
    if name != "auto":
        if name in registry.broken:
            raise BackendError(f"backend {name!r} is broken: {registry.broken[name].reason}; {registry.describe()}")
        if name not in registry.plugins:
            raise BackendError(f"no backend named {name!r}; {registry.describe()}")
        reason = registry.check(name)
        if reason:
            raise BackendError(f"backend {name!r} is not usable here: {reason}; {registry.describe()}")
        return name
    usable = {}
    for n in registry.plugins:
        info = registry.info(n)
        if info.accelerator and registry.check(n) is None:
            usable[n] = info
    refined = {info.specializes for info in usable.values() if info.specializes}
    candidates = sorted(n for n in usable if n not in refined)
    if len(candidates) > 1:
        raise BackendError(
            f"backend auto: {' and '.join(candidates)} both claim this machine; name one in the "
            f"deployment's 'backend' or restrict with {ALLOW_ENV}; {registry.describe()}"
        )
    if candidates:
        return candidates[0]
    if "reference" in registry.plugins:
        return "reference"
    raise BackendError(f"no usable backend; {registry.describe()}")
