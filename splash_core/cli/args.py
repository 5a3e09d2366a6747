"""Argument types shared by the subcommands: bad values fail while the command line is parsed,
before anything runs, as one line (``splash plan: error: argument --batch: must be >= 1 (got 0)``)."""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")  # what the plots are written as (matplotlib picks by suffix)
NO_MATPLOTLIB = "drawing needs matplotlib, which is not installed: pip install 'splash-serve[report]'"


class UsageError(ValueError):
    """Bad input from the user: printed as one line, exit code 2."""


def _number(text: str, kind: type):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'} "
                                         f"(got {text!r})") from None


def at_least(low: int):
    """An int type accepting ``low`` or more."""
    def parse(text: str) -> int:
        value = _number(text, int)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low} (got {value})")
        return value

    return parse


def positive_float(text: str) -> float:
    value = _number(text, float)
    if not value > 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {text})")
    return value


def can_draw() -> bool:
    """Whether matplotlib is installed (the ``report`` extra); imported only where a plot is drawn."""
    return importlib.util.find_spec("matplotlib") is not None


def figure_path(text: str) -> str:
    """A file to draw into: matplotlib installed, a known image suffix, and :func:`writable_file`."""
    if not can_draw():
        raise argparse.ArgumentTypeError(NO_MATPLOTLIB)
    path = Path(text)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text}: unsupported figure format {path.suffix or '(none)'!r}; "
                                         f"use {', '.join(FIGURE_SUFFIXES)}")
    return writable_file(text)


def writable_file(text: str) -> str:
    """A file to write: not a folder, in a folder that exists and that this process may write in.
    Checked while the command line is parsed, so that a write at the end never loses the work
    done before it."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: folder {path.parent} does not exist")
    if path.exists():
        try:
            open(path, "ab").close()  # opened for writing, its contents untouched
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{text}: cannot write the file: {exc.strerror}") from None
    else:
        _probe_folder(path.parent, text)
    return text


def writable_dir(text: str) -> str:
    """A folder to write into, made (with its parents) where missing: not a file, and the
    nearest folder that exists may be written in."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    nearest = next(p for p in (path, *path.parents) if p.exists())
    if not nearest.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {nearest} is a file, not a directory")
    _probe_folder(nearest, text)
    return text


def _probe_folder(folder: Path, text: str) -> None:
    """Create (and drop) a nameless file in ``folder``: the one test that sees permissions,
    read-only mounts and folders no file may be made in alike."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: cannot write in folder {folder}: {exc.strerror}") from None


def existing_dir(text: str) -> str:
    path = Path(text)
    if path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: directory does not exist")
    return text


def add_switch_options(p: argparse.ArgumentParser) -> None:
    """``--switch-mode`` and ``--precopy-steps``, as ``splash run`` and ``splash serve`` take them."""
    p.add_argument("--switch-mode", choices=("splash", "blocking", "precopy", "auto"), default="splash",
                   help="how a switch moves state: layer-pipelined (splash, default), all before the step "
                        "(blocking), pre-copied in the background of --precopy-steps steps, then handed off "
                        "with the tokens appended meanwhile (precopy), or either, as the scheduler finds "
                        "cheaper (auto: Eq 7 extended to pre-copies of up to --precopy-steps steps)")
    p.add_argument("--precopy-steps", type=at_least(1), default=4,
                   help="steps a pre-copy spans before its handoff (--switch-mode precopy; the most with auto; "
                        "default 4)")
