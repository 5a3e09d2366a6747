"""An expanded-form attention that runs, per call, one of several providers of the same contract
(:mod:`.expanded`), chosen from the call's head count and query rows (a backend's measured
table decides; :mod:`splash_core.testing` checks every provider it holds against the reference);
a host index (:class:`~.expanded_plan.HostIndex`) reaches the providers that take one."""

from __future__ import annotations

import dataclasses
from typing import Callable

from .expanded_plan import call_expanded


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

    @property
    def takes_host_index(self) -> bool:
        return any(getattr(p, "takes_host_index", False) for _, p in self.providers)

    def __call__(self, q, *args, host=None):
        return call_expanded(self.provider(q.shape[1], q.shape[0]), host, q, *args)

    def warm_up(self, *args, **kwargs) -> int:
        """Every provider's ``warm_up`` (those that have one; :meth:`SdpaExpanded.warm_up`'s
        arguments): the number of shapes run."""
        return sum(p.warm_up(*args, **kwargs) for _, p in self.providers if hasattr(p, "warm_up"))
