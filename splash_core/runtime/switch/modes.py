"""The three ways to run a switching step (paper §5.5, appendix F.2)."""

from __future__ import annotations

import enum


class Mode(str, enum.Enum):
    """How a switching step obtains its destination state.

    - ``splash``: overlapped. Layer 1's missing state is fetched first (exposed); then, while
      layer i−1 computes in the destination layout, layer i's discards, all-gathers and
      all-to-alls run on a side stream over a second communicator. Each layer waits only for
      its own state; at most one layer is in transit.
    - ``blocking``: every layer's missing state is fetched (layer by layer, each retired before
      the next starts, so Eq 5 still holds) before the step computes; the timed interval covers
      both.
    - ``ready`` (target-ready, measurement only): the destination state is made resident first,
      untimed, then the step is timed. ΔT = T_mode − T_ready is the overhead of Eq 15.

    All three compute the same step in the same destination layouts on the same data, so their
    logits are identical.
    """

    SPLASH = "splash"
    BLOCKING = "blocking"
    READY = "ready"

    @classmethod
    def parse(cls, value: "Mode | str") -> "Mode":
        if isinstance(value, Mode):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ValueError(f"unknown switch mode {value!r}; expected one of "
                             f"{', '.join(m.value for m in cls)}") from None

    def __str__(self) -> str:
        return self.value
