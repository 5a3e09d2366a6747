"""``splash profiles``: list, show and check YAML profiles.

``splash profiles`` lists every kind and the names found on the search path;
``splash profiles show KIND NAME`` prints one profile as loaded (validated, defaults filled);
``splash profiles check FILE...`` validates files and exits 2 if any is bad, printing one
``file: key.path: reason (got X)`` line per bad file.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Mapping
from pathlib import Path

import yaml

from .. import profiles
from ..model.kv_format import kv_format_problem
from ..platform import plugins
from ..profiles import loader
from ..profiles.quantity import Quantity
from .args import UsageError
from .output import jsonable, print_json, table

# folder names under a profile root, so `check` can tell a file's kind when it has no `kind:`
_FOLDER_KINDS = {"hardware": "hardware", "models": "model", "deployments": "deployment",
                 "scenarios": "scenario", "workloads": "workload"}


def add_parser(sub) -> None:
    p = sub.add_parser("profiles", help="list, show and check YAML profiles")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_list)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    show = actions.add_parser("show", help="print one profile as loaded")
    show.add_argument("kind", help=f"one of {', '.join(loader.kinds())}")
    show.add_argument("name", help="profile name or path")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=run_show)
    check = actions.add_parser("check", help="validate profile files (exit 2 if any is bad)")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=run_check)


def _kind(text: str) -> str:
    kind = _FOLDER_KINDS.get(text, text)
    if kind not in loader.kinds():
        raise UsageError(f"unknown profile kind {text!r}; expected one of {', '.join(loader.kinds())}")
    return kind


def _class_of(kind: str) -> type:
    try:
        return loader.profile_class(kind)
    except ModuleNotFoundError:
        raise UsageError(f"profile kind {kind!r} is not available in this version of splash") from None


def run_list(args) -> int:
    listing = {kind: profiles.available(kind) for kind in loader.kinds()}
    if args.json:
        print_json({"search_path": [str(p) for p in loader.search_roots()], "profiles": listing})
        return 0
    rows = [(kind, ", ".join(names) or "-") for kind, names in listing.items()]
    print(table(rows, ["kind", "profiles"], align="ll"))
    print("\nsearch path: " + ", ".join(str(p) for p in loader.search_roots()))
    return 0


def run_show(args) -> int:
    kind = _kind(args.kind)
    _class_of(kind)
    profile = profiles.load(kind, args.name)
    if args.json:
        print_json({"kind": kind, **jsonable(profile)})
        return 0
    print(table(list(_flatten(profile, "")), ["key", "value"], align="ll"))
    return 0


def _flatten(obj, prefix: str):
    """(key.path, shown value) rows; provenance-tagged numbers show where they came from."""
    if isinstance(obj, Quantity):
        yield prefix, f"{_shown(obj.value)} ({obj.label})"
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _flatten(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    elif isinstance(obj, Mapping) and obj and all(isinstance(v, Quantity) for v in obj.values()):
        for key, value in obj.items():  # per-layout numbers (layer_overhead_us.TP ...)
            yield from _flatten(value, f"{prefix}.{jsonable(key)}")
    elif isinstance(obj, (list, tuple)) and obj and dataclasses.is_dataclass(obj[0]):
        for i, item in enumerate(obj):
            yield from _flatten(item, f"{prefix}[{i}]")
    else:
        yield prefix, _shown(jsonable(obj))


def _shown(value) -> str:
    """A value as the YAML file would hold it (loaded numbers shown exactly), on one line."""
    if isinstance(value, str):
        return value
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf"))
    return text.splitlines()[0]  # a scalar's dump ends with a "..." line


def _kind_of_file(path: Path) -> str:
    """The file's declared ``kind:``, else the kind its folder holds; a file whose YAML does
    not parse gets its folder's kind or 'model': the loader reports the YAML error before
    the kind matters."""
    folder_kind = _FOLDER_KINDS.get(path.parent.name)
    try:
        data = loader.read_yaml(path)
    except profiles.ProfileError:
        return folder_kind or "model"
    declared = data.get("kind") if isinstance(data, dict) else None
    if isinstance(declared, str) and declared in loader.kinds():
        return declared
    if folder_kind:
        return folder_kind
    raise profiles.ProfileError(str(path), "kind", f"cannot tell the profile kind: add `kind: "
                                f"{'|'.join(loader.kinds())}` or keep it in a folder named after its kind",
                                declared if declared is not None else None)


def _check_backend(path: Path, deployment, registry) -> None:
    """A deployment must name a backend that is installed (usable here or not: profiles for
    other machines check everywhere)."""
    name = deployment.backend
    if name == "auto" or name in registry.plugins:
        return
    if name in registry.broken:
        reason = f"backend {name!r} is installed but broken: {registry.broken[name].reason}"
    else:
        installed = ", ".join(sorted([*registry.plugins, *registry.broken])) or "none"
        reason = f"no backend named {name!r} is installed (installed: {installed}; see splash backends)"
    raise profiles.ProfileError(str(path), "backend", reason)


def _check_file(name: str, backends) -> dict:
    """One file's verdict: ok with its kind and name (and, for a deployment the runtime cannot
    serve, why: it still serves the cost-model commands), or the error line."""
    path = Path(name)
    try:
        if path.is_dir():
            raise profiles.ProfileError(name, "(file)", "is a directory, not a file")
        if not path.exists():
            raise profiles.ProfileError(name, "(file)", "the file does not exist")
        kind = _kind_of_file(path)
        _class_of(kind)
        profile = loader.load_file(kind, path)
        result = {"file": name, "ok": True, "kind": kind, "name": profile.name}
        if kind == "deployment":
            _check_backend(path, profile, backends())
            result["runtime"] = kv_format_problem(profile.model) or "runs"
        return result
    except profiles.ProfileError as exc:
        return {"file": name, "ok": False, "error": str(exc)}
    except UsageError as exc:
        return {"file": name, "ok": False, "error": f"{name}: kind: {exc}"}


def run_check(args) -> int:
    backends = functools.cache(plugins.load)  # loaded once, and only if a deployment is checked
    results = [_check_file(name, backends) for name in args.files]
    if args.json:
        print_json(results)
    else:
        for r in results:
            if not r["ok"]:
                print(r["error"], file=sys.stderr)
                continue
            note = "" if r.get("runtime", "runs") == "runs" else f"; cost-model commands only: {r['runtime']}"
            print(f"ok  {r['file']} ({r['kind']} {r['name']}{note})")
    return 0 if all(r["ok"] for r in results) else 2
