"""Which kernel serves MLA decode at each head count: the one ``bench/peer_kernels.py`` measured
faster on an H200 (``tuned/providers.json``; written by that benchmark's ``--write-providers``).

Heads between measured counts take the choice of the nearest measured count below (above, for
fewer heads than any measured); with no measurement, or without the FlashMLA wheel, the Triton
kernel serves every call.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

PROVIDERS = Path(__file__).with_name("tuned") / "providers.json"


@functools.lru_cache(maxsize=None)
def load(path: str | Path = PROVIDERS) -> dict:
    """``{"decode": {heads: provider}, ...provenance}``; {} where nothing was measured. Errors name the file."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        decode = {int(h): str(row["winner"]) for h, row in data["decode"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a provider table: {exc}") from None
    return {**data, "decode": decode}


def decode_provider(heads: int, table: dict | None = None) -> str:
    """``"flashmla"`` or ``"triton"`` for a decode call with ``heads`` heads per rank."""
    measured = (load() if table is None else table).get("decode", {})
    if not measured:
        return "triton"
    below = [h for h in measured if h <= heads]
    return measured[max(below)] if below else measured[min(measured)]


def describe(flashmla_missing: str | None) -> str:
    """One line for ``splash backends``: what serves decode, and why."""
    if flashmla_missing:
        return f"decode: triton ({flashmla_missing})"
    measured = load().get("decode", {})
    if not measured:
        return "decode: triton (FlashMLA installed, no measured provider table yet)"
    picks = ", ".join(f"{h} heads: {p}" for h, p in sorted(measured.items()))
    return f"decode by measurement ({picks})"
