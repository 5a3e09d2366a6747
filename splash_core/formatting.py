"""How numbers read in tables and one-line messages: one rule for every command (and the run
summary), so the same quantity never appears as 0.5, 0.500 and 5e-01 in three places."""

from __future__ import annotations

import enum
import math
from typing import Any, Sequence

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def decimals(values: Sequence[float]) -> int:
    """Decimals that give the smallest non-zero magnitude among ``values`` 4 significant digits
    (0 from 1,000 up, at most 3): what a column of them shares, so the column lines up."""
    finite = [abs(v) for v in values if v and math.isfinite(v)]
    if not finite:
        return 0
    return max(0, min(3, 3 - math.floor(math.log10(min(finite)))))


def number(value: float, places: int | None = None) -> str:
    """A number as every table and message shows it: thousands separators, 4 significant digits
    (``places`` decimals when given, as a table column passes), exponent form when very large or
    small; never "-0"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.4g}"
    text = f"{value:,.{decimals([value]) if places is None else places}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.,") else text


def percent(fraction: float, *, signed: bool = False, decimals: int = 1) -> str:
    """``fraction`` as a percentage; a value that rounds to zero is "0.0%", never "-0.0%"."""
    value = round(100.0 * fraction, decimals)
    if value == 0:
        return f"{0.0:.{decimals}f}%"
    return f"{value:{'+' if signed else ''}.{decimals}f}%"


def size(nbytes: float) -> str:
    """Bytes in binary units: '512 B', '478.1 KiB', '2.25 GiB'."""
    value, unit = float(nbytes), _UNITS[0]
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:,.{1 if abs(value) >= 100 else 2}f} {unit}"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], align: str | None = None) -> str:
    """A plain aligned table; ``align`` is one of 'l'/'r' per column (default: numbers right).
    Numbers go through :func:`number`, the floats of a column with the decimals they share
    (:func:`decimals`); every cell is one line (a line break shows as a space)."""
    places = [decimals([r[i] for r in rows if isinstance(r[i], float)]) for i in range(len(headers))]
    cells = [[" ".join(_cell(c, places[i]).split("\n")) for i, c in enumerate(row)] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if align is None:
        align = "".join("r" if rows and isinstance(rows[0][i], (int, float)) else "l" for i in range(len(headers)))

    def line(values):
        return "  ".join(v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(values, widths, align)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _cell(value: Any, places: int) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float):
        return number(value, places)
    return number(value) if isinstance(value, int) and not isinstance(value, bool) else str(value)
