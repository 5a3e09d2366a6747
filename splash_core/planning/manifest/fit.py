"""Eq 5, in one place: the most attention state a rank holds during a switch, and whether it fits.

A switch moves one layer at a time: while layer i is in flight, the layers before it hold their
destination state, the layers after it their source state, and layer i its send and receive
buffers too. Its peak per rank is Eq 5's max(M_r(a), M_r(b)) + Δ_layer_r, or that layer-by-layer
sweep where a hybrid stack's kinds grow in opposite directions and it is higher. The scheduler
(through :meth:`Manifest.fits <splash_core.planning.manifest.plan.Manifest.fits>`) and the
switch executor's planner (for the layers it moves, a deferred layer and layers already in the
destination) both judge a switch by :func:`eq5_fit` of :func:`switch_peak`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

GIB = float(1 << 30)


@dataclasses.dataclass(frozen=True)
class Fit:
    """Eq 5 against a per-rank budget H_r: max(M_r(a), M_r(b)) + Δ_layer_r + R_r ≤ H_r."""

    fits: bool
    budget_bytes: float
    reserve_bytes: float
    peak_bytes: np.ndarray  # [T] peak + reserve per rank
    busiest_rank: int

    def explain(self) -> str:
        r = self.busiest_rank
        verdict = "fits" if self.fits else "does not fit"
        return (f"the switch {verdict}: rank {r} peaks at {self.peak_bytes[r] / GIB:.3f} GiB "
                f"(incl. reserve {self.reserve_bytes / GIB:.3f} GiB) of {self.budget_bytes / GIB:.3f} GiB")

    def refusal(self) -> str | None:
        """Why the switch may not run (with the numbers), or None when it fits."""
        if self.fits:
            return None
        r = self.busiest_rank
        return (f"Eq 5: rank {r} would peak at {self.peak_bytes[r] / GIB:.3f} GiB of attention state during the "
                f"switch (reserve {self.reserve_bytes / GIB:.3f} GiB included), over its budget of "
                f"{self.budget_bytes / GIB:.3f} GiB")


def switch_peak(source: np.ndarray, dest: np.ndarray, transit: np.ndarray) -> np.ndarray:
    """Per rank, the most attention state held at any point of a switch, from per-layer bytes
    [L, T] held before it (``source``), after it (``dest``) and in flight (``transit``: receive plus
    send buffers; a layer that does not move holds the same before and after and nothing in flight)."""
    eq5 = np.maximum(source.sum(0), dest.sum(0)) + transit.max(0)
    return np.maximum(eq5, layer_sweep(source, dest, transit))


def layer_sweep(source: np.ndarray, dest: np.ndarray, transit: np.ndarray) -> np.ndarray:
    """The layer-by-layer peak of :func:`switch_peak`: while layer i is in flight, earlier layers
    hold their destination state, later ones their source state."""
    done = np.cumsum(dest, axis=0) - dest  # layers before i, switched
    ahead = np.cumsum(source[::-1], axis=0)[::-1]  # layers i.., not yet switched
    return (done + ahead + transit).max(0)


def eq5_fit(peak: np.ndarray, budget_bytes: float, reserve_bytes: float = 0.0) -> Fit:
    """Whether every rank's ``peak`` plus ``reserve_bytes`` (R_r) stays within ``budget_bytes``
    (H_r less the state outside attention)."""
    total = peak + reserve_bytes
    return Fit(bool((total <= budget_bytes).all()), float(budget_bytes), float(reserve_bytes), total,
               int(np.argmax(total)))
