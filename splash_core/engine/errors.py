"""The engine's error: a run that stopped, naming the rank and the cause."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The run stopped: names the rank and step."""
