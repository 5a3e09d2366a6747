"""The paper's illustrative timing law (appendix B.1, Eq 11-12) and its crossovers.

The law is data: a scenario file writes each layout's dimensionless reference cost τ_ℓ as a
small arithmetic expression (:class:`~splash_core.profiles.expressions.Expression`) over the argument ``x`` (itself an
expression over the nominal input length ``L`` and named constants such as α), plus helper
definitions such as ``a(x)``. The plotted, normalized latency of Eq 12 is

    t̃_ℓ(L) = τ_ℓ(x(L)) / τ_ref(x(L_ref))

with the reference layout and length named in the file (the paper: TP at 1k). Nothing here
knows the paper's coefficients; they live in ``profiles/scenarios/*.yaml``.

:func:`crossovers` finds where the fastest *feasible* layout changes along L, given each
layout's KV limit (a layout is feasible at L when L does not exceed its limit).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import numpy as np

from ..layouts import Layout
from ..profiles.expressions import Expression


@dataclasses.dataclass(frozen=True)
class CompiledLaw:
    """A timing law ready to evaluate: constants, the argument x(L), ordered definitions and
    one cost expression per layout, normalized by ``reference_layout`` at ``reference_tokens``."""

    constants: Mapping[str, float]
    argument: Expression
    definitions: tuple[tuple[str, Expression], ...]
    costs: Mapping[Layout, Expression]
    reference_layout: Layout
    reference_tokens: float

    def raw(self, tokens) -> dict[Layout, np.ndarray]:
        """τ_ℓ(x(L)) for every layout (Eq 11), on a float or an array of nominal lengths L."""
        env: dict[str, object] = dict(self.constants)
        env["L"] = np.asarray(tokens, dtype=np.float64)
        env["x"] = self.argument(env)
        for name, expr in self.definitions:
            env[name] = expr(env)
        return {layout: np.broadcast_to(np.asarray(expr(env), dtype=np.float64), env["L"].shape)
                for layout, expr in self.costs.items()}

    def normalized(self, tokens) -> dict[Layout, np.ndarray]:
        """t̃_ℓ(L) of Eq 12: each cost divided by the reference layout's cost at the reference length."""
        ref = float(self.raw(self.reference_tokens)[self.reference_layout])
        return {layout: values / ref for layout, values in self.raw(tokens).items()}


def compile_law(spec) -> CompiledLaw:
    """The law a scenario profile's ``timing`` section (:class:`~splash_core.profiles.scenario.TimingLawSpec`) writes."""
    return CompiledLaw(
        constants=dict(spec.constants),
        argument=Expression(spec.argument),
        definitions=tuple((k, Expression(v)) for k, v in spec.definitions.items()),
        costs={k: Expression(v) for k, v in spec.layouts.items()},
        reference_layout=spec.normalize_layout,
        reference_tokens=spec.normalize_tokens,
    )


# ---- crossovers of the fastest feasible layout ----------------------------------------------

@dataclasses.dataclass(frozen=True)
class Crossover:
    """The fastest feasible layout changes at ``tokens`` (nominal input length L).

    ``cause`` is ``timing`` (two curves cross) or ``capacity`` (the leader's KV limit ends its
    feasible range). ``after`` is None where no layout is feasible beyond this point."""

    tokens: float
    before: Layout
    after: Layout | None
    cause: str


def fastest_feasible(law: CompiledLaw, tokens: np.ndarray,
                     limits: Mapping[Layout, float | None]) -> np.ndarray:
    """Index into ``law.costs`` order of the fastest feasible layout at each L (-1: none fits)."""
    layouts = list(law.costs)
    curves = law.raw(tokens)
    stacked = np.stack([curves[l] for l in layouts])
    for i, layout in enumerate(layouts):
        limit = limits.get(layout)
        if limit is not None:
            stacked[i, tokens > limit] = np.inf
    best = np.argmin(stacked, axis=0)
    best[~np.isfinite(stacked.min(axis=0))] = -1
    return best


def crossovers(law: CompiledLaw, limits: Mapping[Layout, float | None], lo: float, hi: float,
               grid_step: float = 16.0, tolerance: float = 1e-3) -> list[Crossover]:
    """Every change of the fastest feasible layout on [lo, hi], located to ``tolerance`` tokens.

    A grid of ``grid_step`` tokens finds the changes; bisection refines each one. Two changes
    closer than the grid step would be missed, which the paper's laws never produce."""
    layouts = list(law.costs)
    n = max(2, int(math.ceil((hi - lo) / grid_step)) + 1)
    grid = np.linspace(lo, hi, n)
    best = fastest_feasible(law, grid, limits)
    out = []
    for j in np.nonzero(best[1:] != best[:-1])[0]:
        a, b = float(grid[j]), float(grid[j + 1])
        first = best[j]
        while b - a > tolerance:
            mid = 0.5 * (a + b)
            if fastest_feasible(law, np.array([mid]), limits)[0] == first:
                a = mid
            else:
                b = mid
        before = layouts[first] if first >= 0 else None
        after_index = best[j + 1]
        after = layouts[after_index] if after_index >= 0 else None
        if before is None:
            continue  # a layout becoming feasible again cannot happen with upper limits only
        limit = limits.get(before)
        cause = "capacity" if limit is not None and abs(limit - b) <= max(tolerance, 1.0) else "timing"
        out.append(Crossover(tokens=0.5 * (a + b), before=before, after=after, cause=cause))
    return out
