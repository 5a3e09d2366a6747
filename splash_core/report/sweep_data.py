"""The sweeps of a ``fixed_layout_sweep`` result: the points sharing a ``sweep`` label, ordered
along the coordinate that varies, with the best layout at each position and where it changes."""

from __future__ import annotations

import dataclasses

from ..results import Result
from .markdown import tokens

LAYOUTS = ("TP", "CP", "DP", "DOP")


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One sweep of a result: the points sharing a ``sweep`` label, ordered along ``axis``
    (the coordinate that varies); ``fixed`` is the other coordinate when it is constant."""

    label: str
    axis: str  # "input_tokens" or "batch"
    fixed: int | None
    positions: tuple[tuple[int, int], ...]  # (batch, input_tokens), in axis order
    values: dict  # (layout, batch, input_tokens) -> tokens/s

    def value(self, layout: str, position: tuple[int, int]) -> float | None:
        return self.values.get((layout, *position))

    def leader(self, position: tuple[int, int]) -> str | None:
        """The layout with the highest throughput at ``position`` (ties: first of TP, CP, DP, DOP)."""
        best = None
        for layout in LAYOUTS:
            v = self.value(layout, position)
            if v is not None and (best is None or v > self.value(best, position)):
                best = layout
        return best

    def x(self, position: tuple[int, int]) -> int:
        return position[1] if self.axis == "input_tokens" else position[0]

    def other(self, position: tuple[int, int]) -> int:
        """The coordinate of ``position`` that does not vary along the axis."""
        return position[0] if self.axis == "input_tokens" else position[1]

    def x_label(self, position: tuple[int, int]) -> str:
        return tokens(position[1]) if self.axis == "input_tokens" else str(position[0])

    def axis_names(self) -> tuple[str, str]:
        """Column names of the varying and the other coordinate."""
        return ("input tokens", "batch") if self.axis == "input_tokens" else ("batch", "input tokens")

    def leader_changes(self) -> list[tuple[str, str, int, int]]:
        """(from, to, last x of the old leader, first x of the new one) along the axis."""
        changes = []
        for a, b in zip(self.positions, self.positions[1:]):
            old, new = self.leader(a), self.leader(b)
            if old and new and old != new:
                changes.append((old, new, self.x(a), self.x(b)))
        return changes


def sweeps(result: Result) -> list[Sweep]:
    """The sweeps of a ``fixed_layout_sweep`` result, in the order their labels first appear."""
    groups: dict[str, list[dict]] = {}
    for point in result["summary"]["points"]:
        groups.setdefault(point["sweep"], []).append(point)
    return [_sweep(label, points) for label, points in groups.items()]


def _sweep(label: str, points: list[dict]) -> Sweep:
    batches = {p["batch"] for p in points}
    inputs = {p["input_tokens"] for p in points}
    axis = "batch" if len(batches) > 1 and len(inputs) == 1 else "input_tokens"
    other = batches if axis == "input_tokens" else inputs
    key = (lambda p: (p[1], p[0])) if axis == "input_tokens" else (lambda p: p)
    positions = tuple(sorted({(p["batch"], p["input_tokens"]) for p in points}, key=key))
    values = {(p["layout"], p["batch"], p["input_tokens"]): p["tokens_per_s"] for p in points}
    return Sweep(label, axis, next(iter(other)) if len(other) == 1 else None, positions, values)
