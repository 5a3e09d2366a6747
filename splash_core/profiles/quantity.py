"""A number with its provenance: measured here, taken from the paper, from a datasheet, or
assumed (with the reason) where no source exists yet."""

from __future__ import annotations

import dataclasses
from typing import Any

from .schema import ProfileError, build, field, one_of

SOURCES = ("measured", "paper", "datasheet", "assumed")


@dataclasses.dataclass(frozen=True)
class Quantity:
    """One hardware constant and where it came from.

    ``measured`` needs date, machine and command; ``paper``, ``datasheet`` and ``assumed``
    need ``ref`` (the table, figure or document, or why the value was assumed). A paper
    figure is never presented as a measurement.
    """

    value: float = field("the number, in the unit the key names")
    source: str = field("measured | paper | datasheet | assumed", checks=[one_of(*SOURCES)])
    ref: str = field("table/figure/document it was taken from, or what was measured", default="")
    date: str = field("date of the measurement (measured only)", default="")
    machine: str = field("machine the measurement ran on (measured only)", default="")
    command: str = field("command that produced it (measured only)", default="")

    def problems(self):
        from .schema import Problem

        if self.source == "measured":
            for key in ("date", "machine", "command"):
                if not getattr(self, key):
                    yield Problem(key, "a measured number needs date, machine and command")
        elif not self.ref:
            yield Problem("ref", f"a {self.source} number needs the table, figure or document it came from")

    @classmethod
    def from_yaml_value(cls, value: Any, *, file: str, path: str) -> "Quantity":
        if not isinstance(value, dict):
            raise ProfileError(
                file, path, "expected {value: N, source: measured|paper|datasheet|assumed, ...}", value
            )
        q = build(cls, value, file=file, path=path)
        if q.value < 0:
            raise ProfileError(file, f"{path}.value", "must be >= 0", q.value)
        return q

    @property
    def label(self) -> str:
        """'measured 2026-11-29 on <machine>' or 'paper Table 3' (for reports)."""
        if self.source == "measured":
            return f"measured {self.date} on {self.machine}"
        return f"{self.source}: {self.ref}"

    def __float__(self) -> float:
        return float(self.value)
