"""The kinds a field of a result's ``summary`` or ``samples`` may have (contract: docs/results.md).

A :class:`~splash_core.results.shapes.Shape` names a kind per field; a trailing ``?`` makes the
field optional. ``text`` non-empty string; ``layout`` TP|CP|DP|DOP; ``state``
weights|kv|indexer|recurrent; ``primitive`` discard|all_gather|all_to_all; ``axis``
input_tokens|batch; ``count`` integer >= 0; ``positive`` integer > 0; ``number`` finite real;
``nonneg`` finite real >= 0; ``fraction`` real in (0, 1]; ``flag`` true|false; ``integer`` any
integer; ``phase`` decode|prefill; ``numbers`` non-empty list of finite reals >= 0; ``pairs``
non-empty list of [integer > 0, integer > 0]; ``texts`` list of non-empty strings; ``labels``
non-empty object of names to non-empty strings; ``counts`` non-empty object of names to integers
>= 0; ``rates`` non-empty list of objects of rate names (ending ``gbps`` or ``tflops``) to
finite reals >= 0; ``object`` any object (what another component wrote, shown as is).

Summary values may also be containers of objects whose fields a shape lists (:data:`CONTAINERS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..layouts import Layout, Primitive, State

LAYOUT_NAMES = tuple(l.value for l in Layout)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_list(v: Any, test: Callable[[Any], bool]) -> bool:
    return isinstance(v, list) and v != [] and all(test(x) for x in v)


def _is_names(v: Any, test: Callable[[Any], bool]) -> bool:
    """A non-empty object whose keys are non-empty names and whose values pass ``test``."""
    return (isinstance(v, dict) and v != {} and all(isinstance(k, str) and k.strip() for k in v)
            and all(test(x) for x in v.values()))


# kind -> (test of a value, what the test wants, in words for the error message)
KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "text": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "layout": (lambda v: v in LAYOUT_NAMES, "one of " + ", ".join(LAYOUT_NAMES)),
    "state": (lambda v: v in {s.value for s in State}, "one of " + ", ".join(s.value for s in State)),
    "primitive": (lambda v: v in {p.value for p in Primitive}, "one of " + ", ".join(p.value for p in Primitive)),
    "axis": (lambda v: v in ("input_tokens", "batch"), "input_tokens or batch"),
    "count": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "positive": (lambda v: _is_int(v) and v > 0, "an integer > 0"),
    "number": (_is_real, "a finite number"),
    "nonneg": (lambda v: _is_real(v) and v >= 0, "a finite number >= 0"),
    "fraction": (lambda v: _is_real(v) and 0 < v <= 1, "a number in (0, 1]"),
    "flag": (lambda v: isinstance(v, bool), "true or false"),
    "integer": (_is_int, "an integer"),
    "phase": (lambda v: v in ("decode", "prefill"), "decode or prefill"),
    "numbers": (lambda v: _is_list(v, lambda x: _is_real(x) and x >= 0), "a non-empty list of finite numbers >= 0"),
    "pairs": (lambda v: _is_list(v, lambda p: _is_list(p, lambda x: _is_int(x) and x > 0) and len(p) == 2),
              "a non-empty list of [integer > 0, integer > 0] pairs"),
    "texts": (lambda v: isinstance(v, list) and all(isinstance(x, str) and x.strip() for x in v),
              "a list of non-empty strings"),
    "labels": (lambda v: _is_names(v, lambda x: isinstance(x, str) and x.strip() != ""),
               "a non-empty object of names to non-empty strings"),
    "counts": (lambda v: _is_names(v, lambda x: _is_int(x) and x >= 0), "a non-empty object of names to integers >= 0"),
    "rates": (lambda v: _is_list(v, lambda r: _is_names(r, lambda x: _is_real(x) and x >= 0)
                                 and all(k.endswith(("gbps", "tflops")) for k in r)),
              "a non-empty list of objects of rate names (ending gbps or tflops) to finite numbers >= 0"),
    "object": (lambda v: isinstance(v, dict), "an object"),
}
# summary values holding objects of listed fields (see Shape): a non-empty list of them, a
# non-empty object of names to them, one of them
CONTAINERS = ("rows", "named", "record")
