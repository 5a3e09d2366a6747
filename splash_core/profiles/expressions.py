"""A small, safe arithmetic expression language: what profile files write formulas in (the
paper's illustrative timing law, Eq 11-12, is written this way in ``profiles/scenarios/``).

An :class:`Expression` is parsed once with :mod:`ast` and evaluated on floats or numpy arrays,
never through ``eval``; :func:`check_names` finds names used before they are defined.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
from typing import Callable, Mapping

import numpy as np

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
