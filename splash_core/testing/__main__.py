"""``python -m splash_core.testing --backend NAME [pytest args]``: the conformance suite."""

from __future__ import annotations

import argparse
import sys

PROG = "python -m splash_core.testing"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--backend", default="reference", help="backend to check (default: reference)")
    args, rest = parser.parse_known_args(argv)
    try:
        import pytest
    except ImportError:
        print(f"{PROG}: error: the conformance suite runs under pytest, which is not installed: "
              "pip install 'splash-serve[conformance]'", file=sys.stderr)
        return 2
    return int(pytest.main(["--pyargs", "splash_core.testing", "--splash-backend", args.backend, *rest]))


if __name__ == "__main__":
    sys.exit(main())
