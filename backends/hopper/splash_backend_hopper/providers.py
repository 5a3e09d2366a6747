"""Which kernel serves an MLA decode call: the one ``bench/peer_kernels.py`` measured faster on
an H200 (``tuned/providers.json``, written by that benchmark's ``--write-providers``).

Per measured head count the table holds the fewest KV tokens of a call (batch x context) from
which FlashMLA was faster at every measured point (``flashmla_from_kv_tokens``; absent: Triton
was faster somewhere at every size). The committed table was measured while FlashMLA planned its
splits on every call (about 0.25 ms however small the call), which kept small calls on Triton; the
adapter now plans once a step for all its layers (:mod:`.flashmla`), so re-measure it with
``bench/peer_kernels.py --write-providers`` (docs/measurements.md says why). Heads between measured
counts take the row of the nearest measured count below (above, for fewer heads than any
measured); with no measurement, or without the FlashMLA wheel, Triton serves every call. Calls
on a scaled-fp8 cache go by their own table (``decode_fp8``, from the benchmark's fp8 points):
FlashMLA's fp8 decode is another kernel, so the bf16 measurement says nothing about it.
Expanded-form prefill attention goes by the ``expanded`` entry (``bench/expanded_attention.py``):
torch's cuDNN attention from a measured number of query rows (in the shape buckets it was measured
with, ``buckets``), else Triton.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

PROVIDERS = Path(__file__).with_name("tuned") / "providers.json"


TABLES = {"bf16": "decode", "fp8": "decode_fp8"}  # cache format -> its table's key


def _thresholds(rows: dict) -> dict:
    return {int(h): (None if row.get("flashmla_from_kv_tokens") is None else int(row["flashmla_from_kv_tokens"]))
            for h, row in rows.items()}


@functools.lru_cache(maxsize=None)
def load(path: str | Path = PROVIDERS) -> dict:
    """``{"decode": {heads: FlashMLA's threshold in KV tokens or None}, "decode_fp8": {...} (if
    measured), ...provenance}``; {} where nothing was measured. Errors name the file."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        tables = {key: _thresholds(data[key]) for key in TABLES.values() if key in data or key == "decode"}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a provider table: {exc}") from None
    return {**data, **tables}


def decode_provider(heads: int, kv_tokens: int, table: dict | None = None, kv: str = "bf16") -> str:
    """``"flashmla"`` or ``"triton"`` for a decode call of ``heads`` heads per rank over
    ``kv_tokens`` listed keys (batch x context) on a ``kv`` ("bf16" or "fp8") cache."""
    measured = (load() if table is None else table).get(TABLES[kv], {})
    if not measured:
        return "triton"
    below = [h for h in measured if h <= heads]
    threshold = measured[max(below)] if below else measured[min(measured)]
    return "flashmla" if threshold is not None and kv_tokens >= threshold else "triton"


def sparse_provider(kv: str = "bf16", table: dict | None = None, phase: str | None = None) -> str:
    """``"flashmla"`` or ``"triton"`` for DeepSeek Sparse Attention on a ``kv`` cache in ``phase``
    (``"decode"``: a row per request, ``"prefill"``; None: every phase): the table's ``sparse``
    entry (``bench/dsa_step.py --write-providers``: FlashMLA only where it was faster at every
    measured point of the phase, or of all phases, with Triton's tokens), Triton where nothing was measured."""
    entry = (load() if table is None else table).get("sparse", {}).get(kv, {})
    chosen = entry.get("phases", {}).get(phase) if phase is not None and "phases" in entry else entry.get("provider")
    return "flashmla" if chosen == "flashmla" else "triton"


SPARSE_PHASES = ("decode", "prefill")


def sparse_somewhere(table: dict | None = None) -> bool:
    """Whether the table chose FlashMLA's sparse attention for some cache format and phase."""
    return any(sparse_provider(kv, table, phase) == "flashmla" for kv in TABLES for phase in SPARSE_PHASES)


def expanded_provider(heads: int, rows: int, table: dict | None = None) -> str:
    """``"sdpa"`` (torch's cuDNN attention, :mod:`splash_core.kernels.expanded_sdpa`) or ``"triton"``
    for an expanded-form call of ``heads`` heads and ``rows`` query rows: the table's ``expanded``
    entry (``bench/expanded_attention.py --write-providers``: per measured head count the fewest
    rows from which SDPA was faster at every larger measured point), heads between measured
    counts as for decode; Triton where nothing was measured."""
    measured = {int(h): row.get("sdpa_from_rows")
                for h, row in (load() if table is None else table).get("expanded", {}).get("heads", {}).items()}
    if not measured:
        return "triton"
    below = [h for h in measured if h <= heads]
    threshold = measured[max(below)] if below else measured[min(measured)]
    return "sdpa" if threshold is not None and rows >= int(threshold) else "triton"


def sdpa_somewhere(table: dict | None = None) -> bool:
    """Whether the table's ``expanded`` entry chose SDPA for some calls."""
    rows = (load() if table is None else table).get("expanded", {}).get("heads", {})
    return any(row.get("sdpa_from_rows") is not None for row in rows.values())


def expanded_buckets(table: dict | None = None) -> dict | None:
    """The shape buckets (:class:`splash_core.kernels.expanded_buckets.BucketSizes` fields) the
    ``expanded`` entry's SDPA was measured with; None: each call its exact shape."""
    buckets = (load() if table is None else table).get("expanded", {}).get("buckets")
    return None if buckets is None else dict(buckets)


def expanded_thresholds(points: list[dict]) -> dict[str, dict]:
    """Per head count of ``bench/expanded_attention.py``'s points (``heads``, ``rows`` of the
    call, ``triton_ms``, ``sdpa_ms``), the fewest rows from which SDPA was faster at every
    measured point of as many rows or more (None: nowhere)."""
    out = {}
    for heads in sorted({p["heads"] for p in points}):
        mine = sorted((p for p in points if p["heads"] == heads), key=lambda p: (p["rows"], p["triton_ms"]))
        start = None
        for p in reversed(mine):  # the longest run of SDPA wins ending at the largest call
            if p.get("sdpa_ms") is None or p["sdpa_ms"] >= p["triton_ms"]:
                break
            start = p["rows"]
        out[str(heads)] = {"sdpa_from_rows": start, "points": len(mine),
                           "sdpa_faster_at_rows": [p["rows"] for p in mine
                                                   if p.get("sdpa_ms") is not None and p["sdpa_ms"] < p["triton_ms"]]}
    return out


def thresholds(samples: list[dict]) -> dict[str, dict]:
    """Per head count of ``bench/peer_kernels.py``'s samples, the fewest KV tokens from which
    FlashMLA was faster than SPLASH's Triton decode at every measured point (None: nowhere)."""
    out = {}
    for heads in sorted({s["heads"] for s in samples}):
        mine = {(s["batch"], s["context"]): s["ms"] for s in samples if s["heads"] == heads and s["kernel"] == "splash"}
        theirs = {(s["batch"], s["context"]): s["ms"] for s in samples
                  if s["heads"] == heads and s["kernel"] == "flashmla" and (s["batch"], s["context"]) in mine}
        points = sorted(theirs, key=lambda p: (p[0] * p[1], p))
        start = None
        for p in reversed(points):  # the longest run of FlashMLA wins ending at the largest call
            if theirs[p] >= mine[p]:
                break
            start = p
        out[str(heads)] = {"flashmla_from_kv_tokens": None if start is None else start[0] * start[1],
                           "points": len(points),
                           "flashmla_faster_at": [list(p) for p in points if theirs[p] < mine[p]]}
    return out


def describe(flashmla_missing: str | None) -> str:
    """One line for ``splash backends``: what serves decode, and why."""
    if flashmla_missing:
        return f"decode: triton ({flashmla_missing})"
    measured = load().get("decode", {})
    if not measured:
        return "decode: triton (FlashMLA installed, no measured provider table yet)"
    picks = ", ".join(f"{h} heads: " + ("triton" if t is None else f"flashmla from {t // 1024}K KV tokens")
                      for h, t in sorted(measured.items()))
    fp8 = load().get("decode_fp8", {})
    fp8_picks = ("; fp8 KV: " + ", ".join(f"{h} heads: " + ("triton" if t is None else f"flashmla from {t // 1024}K")
                                          for h, t in sorted(fp8.items()))) if fp8 else "; fp8 KV: triton (not measured)"
    sparse = ", ".join(f"{kv} KV {phase}: {sparse_provider(kv, phase=phase)}"
                       for kv in TABLES for phase in SPARSE_PHASES)
    return f"decode by measurement ({picks}; else triton{fp8_picks}); sparse attention: {sparse}"


def describe_expanded() -> str:
    """What serves expanded-form prefill attention, by the measured table."""
    measured = load().get("expanded", {}).get("heads", {})
    if not measured:
        return "expanded prefill: triton (not measured)"
    picks = ", ".join(f"{h} heads: " + ("triton" if row.get("sdpa_from_rows") is None
                                        else f"sdpa from {row['sdpa_from_rows']} rows")
                      for h, row in sorted(measured.items(), key=lambda kv: int(kv[0])))
    buckets = expanded_buckets()
    return f"expanded prefill by measurement ({picks}; sdpa in " + (f"shape buckets {buckets})" if buckets
                                                                   else "exact shapes)")


def scaled_mm_from_rows(table: dict | None = None) -> int | None:
    """The ``fp8_linear`` entry (``bench/fp8_gemm.py --write-providers``): the fewest activation rows
    from which torch's block-scaled ``scaled_mm`` serves whole-block FP8 weights (None: never)."""
    rows = (load() if table is None else table).get("fp8_linear", {}).get("scaled_mm_from_rows")
    return None if rows is None else int(rows)


def fp8_tiles(table: dict | None = None) -> dict[tuple[int, int], list[tuple[int, list[int]]]]:
    """The ``fp8_tiles`` entry (``bench/fp8_gemm.py --write-tiles``): for each weight [n, k], the
    Triton tile measured fastest at each batch size, as (most rows, tile fields) by rising rows."""
    measured = (load() if table is None else table).get("fp8_tiles", {}).get("weights", {})
    return {tuple(int(v) for v in key.split("x")): sorted((int(rows), list(tile)) for rows, tile in points.items())
            for key, points in measured.items()}


def describe_fp8_linear(table: dict | None = None) -> str:
    """What serves FP8 block-scaled GEMMs, by the measured table."""
    threshold = scaled_mm_from_rows(table)
    tiles = fp8_tiles(table)
    triton = f"triton ({len(tiles)} weight shapes with measured tiles)" if tiles else "triton"
    return (f"fp8 GEMMs: {triton} (scaled_mm not measured faster)" if threshold is None
            else f"fp8 GEMMs: scaled_mm from {threshold} rows on whole blocks, else {triton}")
