"""The paper's numbers (bench/reference/*.csv) as results of our schema, with source "paper".

Each CSV row names a paper platform label (e.g. ``B200/GLM-5.3``); ``paper.yaml`` beside the
CSVs says which platform, model, group size and dtypes that label means and which table or
figure each kind of number comes from. The results built here are validated exactly like
measured files, so a paper panel and a measured panel render through the same code.
"""

from __future__ import annotations

import csv
import re
from decimal import Decimal
from pathlib import Path

import yaml

from ..layouts import Layout
from ..results import SCHEMA_VERSION, Result, ResultError, validate

LAYOUT_NAMES = tuple(l.value for l in Layout)
GIB = Decimal(1 << 30)
_WORKLOAD = re.compile(r"^(?P<label>.*?)\s*\((?P<workload>[^)]*)\)\s*$")


def load_reference(root: str | Path = "bench/reference") -> list[Result]:
    """Every paper result under ``root``; a missing file or unknown platform label is an error
    naming the file and line."""
    root = Path(root)
    meta_path = root / "paper.yaml"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: the paper's reference data is missing (expected paper.yaml)")
    meta = yaml.safe_load(meta_path.read_text())
    builders = (("fixed_layout_sweeps.csv", _sweeps), ("primitive_costs.csv", _primitives),
                ("switch_overheads.csv", _switches), ("kv_capacity.csv", _capacity),
                ("crossovers.csv", _crossovers))
    results = []
    for name, build in builders:
        path = root / name
        groups: dict[tuple[str, str], list[dict]] = {}
        for line, row in _rows(path):
            label, workload = _split_label(row["platform"])
            if label not in meta["platforms"]:
                raise ResultError(f"{path}:{line}: platform {label!r} is not described in {meta_path}")
            row["_line"] = line
            groups.setdefault((label, workload), []).append(row)
        for (label, workload), rows in groups.items():
            try:
                benchmark, summary = build(rows, workload)
            except ResultError as exc:
                raise ResultError(f"{path}:{exc}") from None
            data = _envelope(meta, label, benchmark, summary, path)
            validate(data, str(path))
            results.append(Result(str(path), data))
    return results


def _rows(path: Path):
    with path.open(newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            yield line, row


def _split_label(text: str) -> tuple[str, str]:
    """'B200/GLM-5.3 (B=16, 256K)' -> ('B200/GLM-5.3', 'B=16, 256K'); no parenthesis -> ''."""
    match = _WORKLOAD.match(text)
    return (match["label"], match["workload"]) if match else (text, "")


def _envelope(meta: dict, label: str, benchmark: str, summary: dict, path: Path) -> dict:
    platform = meta["platforms"][label]
    return {
        "schema": SCHEMA_VERSION,
        "benchmark": benchmark,
        "platform": platform["platform"],
        "machine": platform["machine"],
        "backend": meta["backend"],
        "model": platform["model"],
        "T": platform["T"],
        "dtype": platform["dtype"],
        "command": f"copied from the paper into {path.as_posix()}",
        "date": meta["date"],
        "git_commit": "n/a (paper)",
        "source": "paper",
        "reference": platform["references"][benchmark],
        "notes": " ".join(meta.get("notes", {}).get(benchmark, "").split()),
        "samples": [],
        "summary": summary,
    }


def _num(row: dict, key: str) -> Decimal:
    try:
        return Decimal(row[key])
    except (ArithmeticError, TypeError, KeyError):
        raise ResultError(f"{row['_line']}: column {key!r} is not a number (got {row.get(key)!r})") from None


def _int(row: dict, key: str) -> int:
    value = _num(row, key)
    if value != value.to_integral_value():
        raise ResultError(f"{row['_line']}: column {key!r} must be a whole number (got {row[key]!r})")
    return int(value)


def _sweeps(rows: list[dict], _workload: str) -> tuple[str, dict]:
    points = [
        {"sweep": row["sweep"], "layout": layout, "batch": _int(row, "batch"),
         "input_tokens": _int(row, "input_tokens"),
         "tokens_per_s": float(_num(row, layout) * 1000),  # the paper prints 10^3 tokens/s
         "runs": 10}
        for row in rows for layout in LAYOUT_NAMES
    ]
    return "fixed_layout_sweep", {"output_tokens": 1024, "points": points}


def _primitives(rows: list[dict], _workload: str) -> tuple[str, dict]:
    workloads = {row["workload"] for row in rows}
    costs = [{"state": row["state"], "src": row["src"], "dst": row["dst"],
              "per_layer_ms": float(_num(row, "per_layer_ms"))} for row in rows]
    return "primitive_costs", {"workload": ", ".join(sorted(workloads)), "costs": costs}


def _switches(rows: list[dict], workload: str) -> tuple[str, dict]:
    keys = ("ready_p50_ms", "blocking_p50_ms", "splash_p50_ms", "blocking_overhead_p50_ms",
            "blocking_overhead_p95_ms", "splash_overhead_p50_ms", "splash_overhead_p95_ms")
    directions = [{"src": row["src"], "dst": row["dst"], **{k: float(_num(row, k)) for k in keys}} for row in rows]
    return "switch_overhead", {"workload": workload, "directions": directions}


def _capacity(rows: list[dict], _workload: str) -> tuple[str, dict]:
    layouts = [{"layout": Layout.parse(row["layout"]).value,
                "pool_bytes_per_rank": int(_num(row, "pool_gib_per_card") * GIB),
                "pool_bytes_per_group": int(_num(row, "pool_gib_per_group") * GIB),
                "distinct_tokens": _int(row, "distinct_tokens")} for row in rows]
    return "kv_capacity", {"memory_fraction": float(_num(rows[0], "memory_fraction")), "layouts": layouts}


def _crossovers(rows: list[dict], _workload: str) -> tuple[str, dict]:
    axis = rows[0]["axis"]
    fixed = "batch" if axis == "input_tokens" else "input_tokens"
    summary = {"axis": axis, fixed: _int(rows[0], fixed), "scenario": "the paper's illustrative timing law",
               # the figures print k = 1,024 tokens (the reading under which `splash crossovers`
               # reproduces them, and the paper's K elsewhere)
               "predicted": [{"at": float(_num(row, "at_k") * 1024), "from": row["from"], "to": row["to"]}
                             for row in rows]}
    return "crossovers", summary
