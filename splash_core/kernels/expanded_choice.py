"""An expanded-form attention that runs, per call, one of several providers of the same contract
(:mod:`.expanded`), chosen from the call's head count and query rows (a backend's measured
table decides; :mod:`splash_core.testing` checks every provider it holds against the reference)."""

from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class ExpandedChoice:
    providers: tuple[tuple[str, Callable], ...]  # (name, expanded attention), the portable one first
    choose: Callable[[int, int], str]  # (heads, query rows) -> a provider's name

    def __post_init__(self):
        if not self.providers:
            raise ValueError("ExpandedChoice needs at least one provider")

    def provider(self, heads: int, rows: int) -> Callable:
        name = self.choose(heads, rows)
        found = dict(self.providers).get(name)
        if found is None:
            raise ValueError(f"expanded provider {name!r} chosen for {heads} heads x {rows} rows is not one of "
                             f"{', '.join(n for n, _ in self.providers)}")
        return found

    def __call__(self, q, *args):
        return self.provider(q.shape[1], q.shape[0])(q, *args)
