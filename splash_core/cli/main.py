"""Entry point of ``splash``. Each subcommand lives in its own module exposing
``add_parser(subparsers)``, which sets ``func(args) -> int`` on its parser.

User errors (bad arguments and profiles, unknown backends, infeasible requests) print one line
naming the cause and exit with code 2, without a traceback. SIGTERM and SIGINT end a command
the same way (exit 143 / 130): spawned ranks are stopped on the way out. Output cut off by its
reader (``splash ... | head``) ends the command quietly, as Unix tools do (exit 141).
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys
import threading

from .. import __version__
from ..platform.plugins import BackendError
from ..profiles import ProfileError
from .args import UsageError

# Subcommand modules, in the order ``splash --help`` lists them.
COMMANDS = (
    "run",
    "generate",
    "serve",
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


DISTRIBUTION = "splash-serve"  # what `pip install` calls this package (the import package is splash_core)


class Terminated(KeyboardInterrupt):
    """SIGTERM: unwinds like Ctrl-C, so open rank pools close their processes."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (``splash plan: error: argument --batch: ...``), exit 2;
    subcommand parsers inherit it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="splash",
        description="SPLASH: switch the parallel layout of MLA attention (TP, CP, DP, DOP) live.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__} ({DISTRIBUTION})")
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
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an argument error already printed
        return exc.code if isinstance(exc.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    restore = _terminate_on_sigterm()
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here rather than at interpreter exit
        return code
    except (ProfileError, BackendError, UsageError, FileNotFoundError) as exc:
        print(f"splash {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe (e.g. to a rank) broke: not the reader going away
        _silence_stdout()
        return 128 + signal.SIGPIPE
    except Terminated:
        if os.environ.get("RANK", "0") == "0":  # torchrun stops the other ranks when one fails, and says so
            print(f"{_fresh_line()}splash: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"{_fresh_line()}splash: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        restore()


def _terminate_on_sigterm():
    """Turn SIGTERM into :class:`Terminated` and SIGINT into KeyboardInterrupt while a command
    runs; returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    # Ctrl-C raises KeyboardInterrupt even where SIGINT came ignored (a background job of a
    # non-interactive shell, or a parent that ignores it): the command's contract is that it stops
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)

    def restore():
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    return restore


def _fresh_line() -> str:
    """A line break on a terminal, where a progress bar or ^C may have left the cursor mid-line."""
    return "\n" if sys.stderr.isatty() else ""


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end was closed (poll reports an error on it)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False  # not a real file (captured): the broken pipe was another one
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """The reader went away: point stdout at /dev/null so the final flush at exit cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
