"""Entry point of ``splash``. Each subcommand lives in its own module exposing
``add_parser(subparsers)``, which sets ``func(args) -> int`` on its parser.

User errors (bad profiles, unknown backends, infeasible requests) print one line naming the
cause and exit with code 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..plugins import BackendError
from ..profiles import ProfileError

# Subcommand modules, in the order ``splash --help`` lists them.
COMMANDS = (
    "run",
    "backends",
    "profiles",
    "weights",
    "plan",
    "capacity",
    "crossovers",
    "decide",
    "simulate",
    "sweep",
    "calibrate",
    "report",
)


class UsageError(ValueError):
    """Bad input from the user: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="splash",
        description="SPLASH: switch the parallel layout of MLA attention (TP, CP, DP, DOP) live.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.{name}":
                continue  # subcommand not built yet in this checkout
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ProfileError, BackendError, UsageError, FileNotFoundError) as exc:
        print(f"splash {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("splash: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
