"""The paper's illustrative timing law (appendix B.1, Eq 11-12) and its crossovers.

The law is data: a scenario file writes each layout's dimensionless reference cost τ_ℓ as a
small arithmetic expression (:class:`Expression`) over the argument ``x`` (itself an
expression over the nominal input length ``L`` and named constants such as α), plus helper
definitions such as ``a(x)``. The plotted, normalized latency of Eq 12 is

    t̃_ℓ(L) = τ_ℓ(x(L)) / τ_ref(x(L_ref))

with the reference layout and length named in the file (the paper: TP at 1k). Nothing here
knows the paper's coefficients; they live in ``profiles/scenarios/*.yaml``.

:func:`crossovers` finds where the fastest *feasible* layout changes along L, given each
layout's KV limit (a layout is feasible at L when L does not exceed its limit).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
from typing import Callable, Mapping

import numpy as np

from .layouts import Layout

# Functions an expression may call: pos(v) is [v]+ of Eq 10-11.
_FUNCTIONS: dict[str, tuple[Callable, int | None]] = {
    "pos": (lambda v: np.maximum(v, 0.0), 1),
    "min": (lambda *v: _fold(np.minimum, v), None),
    "max": (lambda *v: _fold(np.maximum, v), None),
    "abs": (np.abs, 1),
    "sqrt": (np.sqrt, 1),
    "log": (np.log, 1),
    "exp": (np.exp, 1),
}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _fold(fn, values):
    out = values[0]
    for v in values[1:]:
        out = fn(out, v)
    return out


class ExpressionError(ValueError):
    """An expression that cannot be parsed or uses something the evaluator does not allow."""


@dataclasses.dataclass(frozen=True)
class Expression:
    """A safe arithmetic expression: numbers, names, + - * / **, unary minus and the calls
    pos(v) = max(v, 0), min(...), max(...), abs, sqrt, log, exp. Evaluated on floats or numpy
    arrays; never through ``eval``."""

    text: str

    def __post_init__(self):
        object.__setattr__(self, "_fn", _compile(self.text))
        object.__setattr__(self, "names", frozenset(_names(self.text)))

    def __call__(self, env: Mapping[str, object]):
        return self._fn(env)


def _parse(text: str) -> ast.expr:
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError("expected a non-empty expression")
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse expression: {exc.msg}") from None


def _names(text: str) -> set[str]:
    out = set()
    for node in ast.walk(_parse(text)):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Call):
            out.discard(node.func.id)  # function names are not variables
    return out - set(_FUNCTIONS)


def _compile(text: str) -> Callable[[Mapping[str, object]], object]:
    return _build(_parse(text))


def _build(node: ast.expr) -> Callable:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        value = float(node.value)
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        return lambda env: env[name]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        op, left, right = _BINARY[type(node.op)], _build(node.left), _build(node.right)
        return lambda env: op(left(env), right(env))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        op, inner = _UNARY[type(node.op)], _build(node.operand)
        return lambda env: op(inner(env))
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            raise ExpressionError(f"unknown function; allowed: {', '.join(_FUNCTIONS)}")
        if node.keywords:
            raise ExpressionError(f"{node.func.id}() takes no keyword arguments")
        fn, arity = _FUNCTIONS[node.func.id]
        if (arity is not None and len(node.args) != arity) or not node.args:
            raise ExpressionError(f"{node.func.id}() takes {arity or 'one or more'} argument(s)")
        args = [_build(a) for a in node.args]
        return lambda env: fn(*(a(env) for a in args))
    raise ExpressionError(f"not allowed in an expression: {ast.unparse(node)!r}")


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


def check_names(constants: Mapping[str, float], argument: Expression,
                definitions: Mapping[str, Expression], costs: Mapping[object, Expression]):
    """Yield (key path, reason) for every name an expression uses before it is defined."""
    known = set(constants) | {"L"}
    for name in argument.names - known:
        yield "argument", f"unknown name {name!r} (known: {', '.join(sorted(known))})"
    known.add("x")
    for key, expr in definitions.items():
        for name in expr.names - known:
            yield f"definitions.{key}", f"unknown name {name!r} (known: {', '.join(sorted(known))})"
        known.add(key)
    for key, expr in costs.items():
        for name in expr.names - known:
            yield f"layouts.{key}", f"unknown name {name!r} (known: {', '.join(sorted(known))})"


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
