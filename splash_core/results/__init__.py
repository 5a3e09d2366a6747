"""One schema for every benchmark result (bench/results/<platform>/*.json).

Every file carries where and how it was produced (platform, machine, backend, model, T,
dtype, command, date, git commit), where its numbers come from (``source``: ``measured`` here,
copied from the ``paper`` with the table or figure in ``reference``, or computed by SPLASH's
cost ``model``), the raw samples and a summary. The shape of ``summary`` and ``samples`` of
a benchmark is a :class:`~splash_core.results.shapes.Shape` its owner registers through the
entry points of :mod:`splash_core.results.registry` (documented in docs/results.md); a
benchmark without one gets the envelope checks alone. :func:`make_result`,
:func:`write_result` and :func:`read_result` all validate, so a writer learns of a mistake
when it writes and a report never renders a malformed file silently; errors name the file and
the field.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform as _platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from .registry import shape_of
from .shapes import shape_error

SCHEMA_VERSION = 1
REQUIRED = {
    "schema": int,
    "benchmark": str,  # which benchmark wrote it (e.g. "switch_overhead", "mla_decode")
    "platform": str,  # results folder: cpu, h200, h200x8, b200, dcu ...
    "machine": str,
    "backend": str,
    "model": str,
    "T": int,
    "dtype": str,
    "command": str,
    "date": str,
    "git_commit": str,
    "source": str,  # measured | paper | model
    "samples": list,
    "summary": dict,
}
OPTIONAL = {
    "reference": str,  # the paper's table or figure; required when source is paper
    "notes": str,  # caveats a reader of the report must see
}
SOURCES = ("measured", "paper", "model")


class ResultError(ValueError):
    """A results file that does not follow the schema; names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Result:
    """A validated benchmark result."""

    path: str
    data: dict

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def benchmark(self) -> str:
        return self.data["benchmark"]

    @property
    def platform(self) -> str:
        return self.data["platform"]


def git_commit(cwd: str | Path | None = None) -> str:
    """``$SPLASH_GIT_COMMIT`` when the sender of the code recorded it (a device machine runs a
    copy whose git metadata may be stale), else the checkout's commit (``+dirty`` with
    uncommitted changes), else "unknown"."""
    if os.environ.get("SPLASH_GIT_COMMIT"):
        return os.environ["SPLASH_GIT_COMMIT"]
    where = cwd or Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=where, timeout=10)
        if out.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=where, timeout=10)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_description() -> str:
    """Host, CPU and accelerator in words (e.g. 'host-x, x86_64, torch 2.11, 2x <device name>').

    Uses torch's device-neutral accelerator API, so the core names no vendor."""
    parts = [socket.gethostname(), _platform.machine()]
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        if accelerator is not None:
            name = torch.get_device_module(accelerator).get_device_name(0)
            parts.append(f"{torch.accelerator.device_count()}x {name}")
        else:
            parts.append(f"{os.cpu_count()} CPU cores")
    except Exception:  # machine description must never fail a benchmark
        parts.append(f"{os.cpu_count()} CPU cores")
    return ", ".join(parts)


def make_result(*, benchmark: str, platform: str, backend: str, model: str, T: int, dtype: str,
                samples: list, summary: dict, source: str = "measured", command: str | None = None,
                machine: str | None = None, reference: str | None = None, notes: str | None = None,
                extra: dict | None = None) -> dict:
    """A result dict with the envelope filled in (date now, command from argv, git commit).

    Raises :class:`ResultError` if the envelope or the benchmark's summary/samples shape
    (docs/results.md) is wrong, before anything is written."""
    data = {
        "schema": SCHEMA_VERSION,
        "benchmark": benchmark,
        "platform": platform,
        "machine": machine or machine_description(),
        "backend": backend,
        "model": model,
        "T": int(T),
        "dtype": dtype,
        "command": command or " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": git_commit(),
        "source": source,
        "samples": samples,
        "summary": summary,
    }
    for key, value in (("reference", reference), ("notes", notes)):
        if value is not None:
            data[key] = value
    if extra:
        clash = set(extra) & set(data)
        if clash:
            raise ValueError(f"extra keys clash with the envelope: {sorted(clash)}")
        data.update(extra)
    validate(data, "<new result>")
    return data


def write_result(data: dict, root: str | Path = "bench/results", name: str | None = None) -> Path:
    """Validate and write ``data`` to ``root/<platform>/<name or benchmark>.json``."""
    validate(data, "<new result>")
    folder = Path(root) / data["platform"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name or data['benchmark']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)  # never leave a half-written result
    return path


def validate(data: Any, where: str) -> None:
    """Raise :class:`ResultError` naming ``where`` and the field if ``data`` breaks the envelope
    or its benchmark's registered shape (a benchmark without one: the envelope alone)."""
    _check_envelope(data, where)
    shape = shape_of(data["benchmark"])
    error = shape_error(data, shape, where) if shape is not None else None
    if error:
        raise ResultError(error)


def _check_envelope(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise ResultError(f"{where}: expected a JSON object")
    for key, tp in REQUIRED.items():
        if key not in data:
            raise ResultError(f"{where}: missing field {key!r}")
        value = data[key]
        if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ResultError(f"{where}: field {key!r} must be an integer (got {value!r})")
        if tp is not int and not isinstance(value, tp):
            raise ResultError(f"{where}: field {key!r} must be a {tp.__name__} (got {type(value).__name__})")
    if data["schema"] != SCHEMA_VERSION:
        raise ResultError(f"{where}: schema {data['schema']} is not {SCHEMA_VERSION}")
    for key, tp in OPTIONAL.items():
        if key in data and not isinstance(data[key], tp):
            raise ResultError(f"{where}: field {key!r} must be a {tp.__name__} (got {type(data[key]).__name__})")
    if data["source"] not in SOURCES:
        raise ResultError(f"{where}: field 'source' must be one of {', '.join(SOURCES)} (got {data['source']!r})")
    if data["source"] == "measured" and not data["samples"]:
        raise ResultError(f"{where}: field 'samples': a measured result needs its raw samples")
    if data["source"] == "paper" and not data.get("reference"):
        raise ResultError(f"{where}: field 'reference': a paper result must name its table or figure")


def read_result(path: str | Path) -> Result:
    """Read and validate one results file; :class:`ResultError` names the file and field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ResultError(f"{path}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    validate(data, str(path))
    return Result(str(path), data)


def read_results(root: str | Path = "bench/results") -> list[Result]:
    """Every result under ``root`` (sorted by path), each validated; a file must sit in the
    folder named by its ``platform`` (as :func:`write_result` puts it)."""
    results = []
    for p in sorted(Path(root).glob("*/*.json")):
        result = read_result(p)
        if result.platform != p.parent.name:
            raise ResultError(f"{p}: field 'platform' is {result.platform!r} but the file is in folder "
                              f"{p.parent.name!r}")
        results.append(result)
    return results
