"""``python -m splash_core.testing --backend NAME [pytest args]``: the conformance suite."""

from __future__ import annotations

import argparse
import sys

import pytest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m splash_core.testing", description=__doc__)
    parser.add_argument("--backend", default="reference", help="backend to check (default: reference)")
    args, rest = parser.parse_known_args(argv)
    return int(pytest.main(["--pyargs", "splash_core.testing", "--splash-backend", args.backend, *rest]))


if __name__ == "__main__":
    sys.exit(main())
