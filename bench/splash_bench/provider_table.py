"""The hopper backend's measured provider table (``tuned/providers.json``) as the benchmarks write
it: each sets its own entries and keeps every other benchmark's."""

from __future__ import annotations

import datetime
import json
from pathlib import Path


def provenance(command: str, machine: str) -> dict:
    """When, where and how an entry was measured."""
    return {"date": datetime.date.today().isoformat(), "machine": machine, "command": command}


def set_entries(path: str | Path, entries: dict) -> dict:
    """Set ``entries`` (top-level keys) of the table at ``path``, other keys kept; the table written."""
    path = Path(path)
    table = json.loads(path.read_text()) if path.is_file() else {}
    table.update(entries)
    path.write_text(json.dumps(table, indent=1) + "\n")
    return table
