"""What a failed ``splash COMMAND`` must print: one line on stderr, nothing on stdout, no traceback."""

from __future__ import annotations


def one_line(capsys, command: str) -> str:
    """The single stderr line of a failed ``splash COMMAND`` (nothing on stdout, no traceback)."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"splash {command}: error: "), captured.err
    assert "Traceback" not in captured.err and not captured.out, captured
    return lines[0]
