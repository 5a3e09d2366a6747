"""``splash backends``: every installed backend, its version, and whether it is usable here."""

from __future__ import annotations

from ..platform import plugins
from .output import print_json, table


def add_parser(sub) -> None:
    p = sub.add_parser("backends", help="list installed backends and whether each is usable here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    registry = plugins.load()
    statuses = registry.statuses()
    try:
        chosen = plugins.select(registry, "auto")
    except plugins.BackendError as exc:
        chosen = None
        auto_error = str(exc).split("; installed backends: ")[0]  # the table below lists them
    if args.json:
        print_json({
            "auto": chosen,
            "backends": [
                {"name": s.name, "version": s.version, "available": s.available, "reason": s.reason,
                 "origin": s.origin, "summary": s.summary, "broken": s.broken,
                 "device_type": s.info.device_type if s.info else None,
                 "specializes": s.info.specializes if s.info else None}
                for s in statuses
            ],
        })
        return 0
    rows = [(s.name, s.version, "yes" if s.available else "no", s.reason or s.summary, s.origin) for s in statuses]
    print(table(rows, ["backend", "version", "usable", "why not / what", "from"], align="lllll"))
    print(f"\nauto selects: {chosen}" if chosen else f"\nauto: {auto_error}")
    return 0
