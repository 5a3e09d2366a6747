"""Moving a switch's layers one at a time: a layer's transfer starts on the side stream, and the
layer *lands* right before it computes (the compute stream waits for its transfer only, its
destination copy becomes live, its layout switches, its source copy is retired); a failed layer
is rolled back (what it allocated is freed, its source state untouched). At most one layer is in
transit, so Eq 5 holds throughout."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from ...layouts import Layout
from ..step_batch import StepBatch
from .precopy import PreCopy
from .transfer import StateMover, Transfer, TransferContext


@dataclasses.dataclass
class LayerMove:
    """One layer in transit: its events (``t_start``/``t_done`` on the side stream, ``w0``/``w1``
    around the compute stream's wait) and each mover's transfer."""

    layer: Any
    events: dict
    transfers: list[tuple[StateMover, Transfer]] = dataclasses.field(default_factory=list)
    host_s: float = 0.0  # host time issuing and landing it


@dataclasses.dataclass
class PreparedSwitch:
    """One switch, checked and ready to move (or moving)."""

    dst: Layout
    src: Layout | str
    order: tuple[int, ...]  # positions of the moving layers in the model
    plan_ms: float
    deferred: int | None = None  # position of the layer that computes in its source layout, then moves
    computes_in: tuple[Layout, ...] = ()  # per layer, the layout it computes the step in
    landed: list[LayerMove] = dataclasses.field(default_factory=list)
    host_s: float = 0.0  # host time of the checks before anything moved (planning included)
    # by layer index: each mover with the plans of its states (shared by the layers of a kind)
    movers: dict[int, tuple[tuple[StateMover, dict], ...]] = dataclasses.field(default_factory=dict)
    precopy: PreCopy | None = None  # the pre-copy this switch hands off: its layers adopt their copies as they land


class Landing:
    """Starts and lands layers of ``model`` over ``io`` (the side communicator and stream).
    ``align``: a layer's transfer starts only once the compute stream reached the layer it overlaps,
    so its collectives find their peers ready. ``tracer``: spans for a benchmark's timeline."""

    def __init__(self, model, io: TransferContext, *, align: bool, tracer=None):
        self.model, self.io, self.align, self.tracer = model, io, align, tracer
        self.streams = io.streams

    def begin(self) -> None:
        """The side stream starts after everything the compute stream issued before the switch."""
        ready = self.streams.new_event()
        ready.record()
        ready.wait(self.io.side_stream)

    def move_all(self, sw: PreparedSwitch) -> None:
        """Every moving layer, in order, before the step (``blocking`` and ``ready``)."""
        self.begin()
        for pos in sw.order:
            self.land(sw, self.start(sw, pos))

    def start(self, sw: PreparedSwitch, pos: int) -> LayerMove:
        with self._span("start"):
            return self._start(sw, pos)

    def land(self, sw: PreparedSwitch, lm: LayerMove) -> None:
        with self._span("land"):
            self._land(sw, lm)

    @staticmethod
    def rollback(lm: LayerMove) -> None:
        for mover, t in reversed(lm.transfers):
            mover.rollback(t)
        lm.transfers = []

    def _span(self, name: str):
        return self.tracer.span(name) if self.tracer is not None else contextlib.nullcontext()

    def _start(self, sw: PreparedSwitch, pos: int) -> LayerMove:
        t0 = time.perf_counter()
        layer, io, streams = self.model.layers[pos], self.io, self.streams
        lm = LayerMove(layer, {k: streams.new_event(timing=True) for k in ("t_start", "t_done", "w0", "w1")})
        if self.align:
            reached = streams.new_event()
            reached.record()  # on the compute stream, where the layer this transfer overlaps begins
            reached.wait(io.side_stream)
        with streams.use_stream(io.side_stream):
            lm.events["t_start"].record(io.side_stream)
            try:
                for mover, plans in sw.movers[layer.index]:
                    lm.transfers.append((mover, mover.start(layer, plans, sw.dst, io)))
            except BaseException:
                self.rollback(lm)
                raise
        lm.host_s = time.perf_counter() - t0
        return lm

    def _land(self, sw: PreparedSwitch, lm: LayerMove) -> None:
        t0 = time.perf_counter()
        io, streams, ev = self.io, self.streams, lm.events
        ev["w0"].record()
        try:
            with streams.use_stream(io.side_stream):
                for mover, t in lm.transfers:
                    mover.finish(t, io)
                ev["t_done"].record(io.side_stream)
            ev["t_done"].wait()  # the compute stream waits for this layer only
            ev["w1"].record()
            args = {}
            for _, t in lm.transfers:
                args.update(t.layout_args)
            lm.layer.set_layout(sw.dst, **args)
        except BaseException:
            self.rollback(lm)
            raise
        self._retire(sw, lm)
        lm.host_s += time.perf_counter() - t0
        sw.landed.append(lm)

    @staticmethod
    def _retire(sw: PreparedSwitch, lm: LayerMove) -> None:
        """The destination copy is live: retire the source copy; a pre-copy's pages of the layer
        join their requests before it computes in the destination."""
        for mover, t in lm.transfers:
            mover.retire(t)
        if sw.precopy is not None:
            sw.precopy.adopt(lm.layer)


def release_new_pages(model, batch: StepBatch, computes_in) -> None:
    """Free the pages ``batch``'s step reserved for its new tokens in the layouts its layers
    compute in (after a failure)."""
    for layer in model.paged_layers:
        for rid, pages in model.new_pages(batch, list(computes_in))[layer.index]:
            layer.kv.free(rid, pages)
