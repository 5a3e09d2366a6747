"""What a live switch raises: refused before anything moved, or failed while moving.

Both are raised on every rank of the group together (the decisions behind them are agreed:
Eq 5 from the same manifest everywhere, pool capacity through one all-reduce, a collective's
failure or timeout on each rank that takes part in it).
"""

from __future__ import annotations

from ...layouts import Layout, State


class SwitchRefused(RuntimeError):
    """The switch would not fit (paper Eq 5, or a layer's KV pool) and nothing moved.

    ``report`` is a :class:`~splash_core.runtime.switch.report.SwitchReport` with
    ``refused=True`` and ``reason`` (the same numbers as the message)."""

    def __init__(self, reason: str, report=None):
        super().__init__(reason)
        self.reason = reason
        self.report = report


class SwitchFailed(RuntimeError):
    """A collective failed or timed out while layer ``layer``'s ``state`` was moving.

    Every request's history is intact: layers before ``layer`` completed the switch (they hold
    the destination layout), layer ``layer`` was rolled back and it and the later ones still hold
    the source layout (``switched`` / ``unswitched`` list them); pages reserved for the step's new
    tokens were released. If the collective really failed, the group's side communicator may be
    unusable afterwards."""

    def __init__(self, message: str, *, layer: int, state: State, dst: Layout,
                 switched: tuple[int, ...] = (), unswitched: tuple[int, ...] = ()):
        super().__init__(message)
        self.layer, self.state, self.dst = layer, state, dst
        self.switched, self.unswitched = switched, unswitched


class TransferError(RuntimeError):
    """Raised by a state mover: the collective (or the write after it) of ``state`` at ``layer``
    failed. The executor rolls back the layer and turns this into :class:`SwitchFailed`."""

    def __init__(self, layer: int, state: State, primitive: str, cause: str):
        super().__init__(f"layer {layer}, state {state} ({primitive}): {cause}")
        self.layer, self.state, self.primitive, self.cause = layer, state, primitive, cause


class InjectedFault(RuntimeError):
    """The failure a test asked for through :class:`~splash_core.runtime.switch.transfer.Fault`."""
