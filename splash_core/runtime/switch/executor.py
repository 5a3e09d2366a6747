"""The switch executor: one serving step during which every layer moves to a destination layout
(paper §4.1, appendix F).

Per switching step, on every rank (all ranks call :meth:`SwitchExecutor.step` with the same
arguments, so every decision below is the same everywhere):

1. Plan (:meth:`SwitchExecutor.plan_switch`, a :class:`~.planning.SwitchPlan`): the manifests
   of the layers not yet in ``dst`` (one per source layout), from the requests' histories before
   the step (:mod:`.planning`), the layer that moves after the step, and Eq 5 against
   ``budget_bytes`` (if given; skipped where the caller's decision already checked it). In a
   serving group rank 0 plans it and broadcasts it with the step (``step(..., plan=...)``): no
   other rank plans or checks Eq 5. Each rank then builds its own key arrays and each mover's
   per-kind route (which keys it sends, fetches and frees, chunked: the same for every layer
   of a kind, see ``StateMover.prepare``); manifests are cached, so a benchmark's repeated
   switch or a scheduler that planned it with :meth:`SwitchExecutor.plan` does not pay twice,
   and a layer's transfer does only that layer's own work (a few array operations on its block
   tables, one index copy to the device, its packs, collectives and unpacks; no host-device
   synchronisation).
2. Check, before anything moves: the plan's Eq 5 verdict, then one host all-reduce
   (``ctx.host_collectives()``: it never waits for the device) of every rank's page needs
   (pages arriving + the step's new pages) against its pools' free pages, and of requests
   holding pages outside the batch. A failure raises :class:`SwitchRefused` (or ValueError for
   stray requests) on every rank.
3. Move, layer by layer, each through the :class:`~.transfer.StateMover` of each of its states
   on a side stream over the side communicator (``ctx.side_collectives()``, async ops):
   ``splash`` starts layer i+1's transfer right before layer i computes (the side stream
   waits until the compute stream gets there, so every rank's collectives start together
   instead of holding processors while their peers are still busy) and lands layer i's just
   before it computes (the compute stream waits on an event; on host streams the wait blocks
   the host while gloo's threads carry the next transfer); ``blocking`` and ``ready``
   land every layer before the step. A layer lands by writing its destination copy, switching
   its layout, then retiring its source copy, so at most one layer is in transit and Eq 5
   holds throughout.

   In ``splash`` the first moving layer has nothing before it to hide its transfer behind, so
   (``transfer.defer_first``, unless it is the last layer or only discards) it computes the step in
   its source layout, its new tokens reserved there, and moves last: its transfer, planned on
   the histories *after* the step, starts right before the last layer computes and lands
   after the step. (Where the source layout computes a layer much slower than the destination
   and the layer's transfer is short, moving it first would cost less; the executor does not
   weigh the two.)
4. On a failure while moving (a collective error or timeout): the layer in transit is rolled
   back (what it allocated is freed, its source state untouched), the pages reserved for the
   step's new tokens are released, and :class:`SwitchFailed` names the layer and state. Earlier
   layers keep the destination layout, later ones the source: every history is intact and the
   model stays consistent (each layer holds exactly its own layout's state).

A switch may also hand off a pre-copy (:mod:`.precopy`, ``step(..., precopy=...)``): its
manifests count the pages the pre-copy placed in earlier steps as held by their destination
holders, so only the dirty tails move, the pool check sets those pages aside, and as each layer
lands (right after its source copy is retired, before it computes) its copies join their
requests. A failure leaves the copies of the layers not switched in place: cancel the pre-copy.

The step's new tokens go straight to the layout each layer computes the step in (their pages are
reserved there), so a request in its first prefill chunk has nothing to move but in the
deferred layer. A failure after the step computed (in the deferred layer's transfer) is
handled as one during it: the step's new pages are released and the caller runs the step again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings

import numpy as np
import torch

from ...layouts import Layout
from ...planning.manifest import Manifest, plan_switch
from ...planning.scheduler import SwitchCheck
from ...profiles.transfer import TransferConfig
from ..step_batch import StepBatch
from .checks import check_batch, check_plan, prepare, ready_routes
from .errors import SwitchFailed, TransferError
from .landing import Landing, LayerMove, PreparedSwitch, release_new_pages
from .modes import Mode
from .pages_mover import PagesMover
from .planner import SwitchPlanner
from .planning import SwitchPlan, history_batch
from .precopy import PreCopy
from .recurrent import RecurrentMover
from .report import SwitchReport, build_report
from .tracing import QUIET, SwitchTracer
from .transfer import Fault, StateMover, TransferContext
from .weights_mover import WeightsMover


def default_movers(transfer: TransferConfig = TransferConfig()) -> list[StateMover]:
    """Movers for every state: weights, KV + indexer pages (MLA, chunked and pulled as
    ``transfer`` says), recurrent state (KDA)."""
    return [WeightsMover(), PagesMover(transfer), RecurrentMover()]


class SwitchExecutor:
    """Executes live layout switches on one rank of the group.

    ``transfer``: the deployment's transfer options (:class:`~splash_core.profiles.transfer.TransferConfig`:
    chunking, pulls, ``align_transfers`` — a layer's transfer starts only once the compute stream
    reached the layer it overlaps, so its collectives find their peers ready — and
    ``defer_first`` — in ``splash``, the first moving layer computes the step in its source
    layout and moves after the last one, unless it only discards; see the module docstring).
    ``budget_bytes``/``reserve_bytes``: H_r less the state outside attention, and R_r, for the
    Eq 5 check (None: only the pools' capacity is checked). ``timeout_s``: how long a transfer's
    collective may take before the switch fails (None: the process group's own timeout; a
    timed wait blocks the host on accelerators, so leave it None there). ``movers``: the state
    movers (default :func:`default_movers`). ``fault``: a :class:`~.transfer.Fault` to inject
    (tests); may be set later as an attribute. ``tracer``: a
    :class:`~.tracing.SwitchTracer` that observes every step and switch (benchmarks).
    """

    def __init__(self, model, ctx, *, budget_bytes: float | None = None, reserve_bytes: float = 0.0,
                 timeout_s: float | None = None, movers: list[StateMover] | None = None, fault: Fault | None = None,
                 transfer: TransferConfig = TransferConfig(), tracer: SwitchTracer | None = None):
        self.model, self.ctx, self.transfer, self.tracer = model, ctx, transfer, tracer
        self.planner = SwitchPlanner(model, transfer, budget_bytes, reserve_bytes)
        self.timeout_s, self.fault = timeout_s, fault
        self.movers = default_movers(transfer) if movers is None else list(movers)
        self._io: TransferContext | None = None

    @property
    def budget_bytes(self) -> float | None:
        """H_r less the state outside attention, for Eq 5 (None: not checked): the planner's."""
        return self.planner.budget_bytes

    @budget_bytes.setter
    def budget_bytes(self, value: float | None) -> None:
        self.planner.budget_bytes = value

    @property
    def reserve_bytes(self) -> float:
        return self.planner.reserve_bytes

    # ---- planning (:class:`~.planner.SwitchPlanner`) ----------------------------------

    def plans(self, dst: Layout | str, batch: StepBatch, *, after_step: bool = False,
              layers: tuple[int, ...] | None = None, copied: np.ndarray | None = None,
              copied_layers: tuple[int, ...] | None = None) -> dict[Layout, Manifest]:
        """The manifests the switch to ``dst`` at ``batch``'s step would execute
        (:meth:`SwitchPlanner.manifests`), this rank's key arrays and the movers' routes computed."""
        manifests = self.planner.manifests(_layout(dst), batch, after_step, layers, copied, copied_layers)
        ready_routes(self.model, self.movers, manifests, self._io)
        return manifests

    def plan_switch(self, dst: Layout | str, batch: StepBatch, mode: Mode | str = Mode.SPLASH, *,
                    decided: SwitchCheck | None = None, precopy: PreCopy | None = None) -> SwitchPlan:
        """The switching step to ``dst`` at ``batch``'s step in ``mode``, as :meth:`step` executes
        it (:meth:`SwitchPlanner.plan_switch`; ``decided``: the scheduler's check of this switch):
        rank 0 plans it and every rank executes the same plan (``step(..., plan=...)``)."""
        return self.planner.plan_switch(_layout(dst), batch, Mode.parse(mode), decided=decided, precopy=precopy)

    def plan(self, dst: Layout | str, batch: StepBatch) -> Manifest:
        """The manifest of the switch to ``dst`` at ``batch``'s step, when all layers share one
        layout (ValueError otherwise: see :meth:`plans`). Its ``fits`` is Eq 5; pass it to
        :func:`splash_core.planning.costmodel.switch_cost` for Eq 7."""
        dst = _layout(dst)
        layouts = {layer.layout for layer in self.model.layers}
        if len(layouts) > 1:
            raise ValueError(f"the layers are in several layouts ({sorted(map(str, layouts))}): use plans()")
        manifests = self.plans(dst, batch)
        if manifests:
            return next(iter(manifests.values()))
        m = self.model  # already in dst: the plan that keeps everything
        return plan_switch(dst, dst, history_batch(batch), m.profile, m.T, m.page_size,
                           layers=[layer.index for layer in m.layers])

    def precopy(self, dst: Layout | str, batch: StepBatch, steps: int) -> PreCopy:
        """Begin a pre-copy to ``dst`` before ``batch``'s step, copying over ``steps`` steps
        (:class:`~.precopy.PreCopy`: run those steps with its ``step``, then hand off with
        ``step(..., precopy=...)``, or ``cancel`` it). Every rank, with the same arguments."""
        return PreCopy(self, _layout(dst), batch, steps)

    # ---- the switching step -----------------------------------------------------------

    def step(self, batch: StepBatch, tokens: torch.Tensor, dst: Layout | str,
             mode: Mode | str = Mode.SPLASH, *, plan: SwitchPlan | None = None,
             precopy: PreCopy | None = None) -> tuple[torch.Tensor, SwitchReport]:
        """One serving step of ``batch`` during which every layer moves to ``dst``; returns the
        step's logits (as :meth:`Model.step`) and this rank's report. ``plan``: the switch as
        :meth:`plan_switch` planned it (on rank 0 of a serving group), else planned here.
        ``precopy``: the pre-copy to ``dst`` this step hands off (only dirty tails move, and the
        layers it has not copied yet move whole;
        after a failure, cancel it: the layers not switched keep their copies until then).
        Raises :class:`SwitchRefused` before anything moves when the switch does not fit, and
        :class:`SwitchFailed` when a transfer fails (see the module docstring)."""
        mode, dst = Mode.parse(mode), _layout(dst)
        streams = self.ctx.streams
        start, end = streams.new_event(timing=True), streams.new_event(timing=True)
        if mode is not Mode.READY:
            start.record()
        sw = self._prepare(dst, batch, mode, plan, precopy)
        try:
            if mode is Mode.SPLASH:
                logits, exposed = self._splash(sw, batch, tokens), None
            else:
                logits, exposed = self._moved_first(sw, batch, tokens, mode, start)
        except TransferError as exc:
            raise self._failed(sw, exc) from exc
        if self.tracer is not None:
            self.tracer.step_end()
        end.record()
        end.synchronize()
        return logits, build_report(self.model, sw, mode, start.elapsed_time(end), exposed)

    def switch(self, batch: StepBatch, dst: Layout | str) -> SwitchReport:
        """Move every layer to ``dst`` now, layer by layer, outside a step (what ``ready`` does
        before its timed step). ``batch`` is the next step's batch: its ``start`` tokens of each
        request are the histories that move. Same checks and failures as :meth:`step`."""
        dst = _layout(dst)
        streams = self.ctx.streams
        start, end = streams.new_event(timing=True), streams.new_event(timing=True)
        start.record()
        sw = self._prepare(dst, batch, Mode.BLOCKING)
        try:
            self._move_all(sw)
        except TransferError as exc:
            raise self._failed(sw, exc) from exc
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        return build_report(self.model, sw, Mode.BLOCKING, ms, ms)

    def _moved_first(self, sw: PreparedSwitch, batch: StepBatch, tokens: torch.Tensor, mode: Mode, start):
        """``ready`` and ``blocking``: every layer lands before the step computes; (logits, exposed
        time: none for ``ready``, whose timed step starts after the move, the move's events else)."""
        streams = self.ctx.streams
        if mode is Mode.READY:
            self._move_all(sw)
            streams.synchronize()
            start.record()
            return self.model.step(batch, tokens, before_layer=self._boundary()), 0.0
        x0, x1 = streams.new_event(timing=True), streams.new_event(timing=True)
        x0.record()
        self._move_all(sw)
        x1.record()
        return self.model.step(batch, tokens, before_layer=self._boundary()), (x0, x1)

    # ---- the side communicator ----------------------------------------------------------

    @property
    def io(self) -> TransferContext:
        """The side communicator and stream (created on the first switch: a collective)."""
        if self._io is None:
            self.use_side(self.ctx.side_collectives(self.transfer), self.ctx.streams.new_stream())
        self._io.timeout_s, self._io.fault = self.timeout_s, self.fault
        return self._io

    @property
    def has_side(self) -> bool:
        """Whether the side communicator exists yet (a switch or pre-copy created it)."""
        return self._io is not None

    def use_side(self, collectives, side_stream) -> None:
        """Move state over ``collectives`` on ``side_stream`` (instead of the rank's side
        communicator and a new stream: benchmark variants). Collective: every rank, before
        the first switch."""
        ctx = self.ctx
        host = ctx.host_collectives()
        self._io = TransferContext(rank=ctx.rank, T=ctx.world_size, device=ctx.device, collectives=collectives,
                                   streams=ctx.streams, side_stream=side_stream, kernels=self.model.kernels,
                                   host=host, peers=self._share_pool(host), tracer=self.tracer or QUIET)

    def begin_side(self) -> None:
        """The side stream starts after everything the compute stream issued so far."""
        self._landing().begin()

    def _share_pool(self, host):
        """The group's KV pools shared for pulls, where the model allocated them in peer memory
        and every rank could share and map them (agreed over ``host``); else None, with a
        warning naming the cause, and pages move by collectives."""
        pool = self.model.pool
        if pool.buffer is None:
            return None
        try:
            peers, error = pool.memory.share(pool.buffer), None
        except Exception as exc:  # noqa: BLE001 - any rank's failure means collectives for everyone
            peers, error = None, f"{type(exc).__name__}: {exc}"
        errors = [(r, e) for r, e in enumerate(host.all_gather_object(error)) if e]
        if errors:
            if peers is not None:
                peers.close()
            warnings.warn(f"switches move KV pages by collectives: rank {errors[0][0]} could not share the KV pool "
                          f"({errors[0][1]})")
            return None
        return peers

    # ---- checking, then moving ----------------------------------------------------------

    def _landing(self) -> Landing:
        """Layer moves over the side communicator (created here on first use: a collective)."""
        return Landing(self.model, self.io, align=self.transfer.align_transfers, tracer=self.tracer)

    def _move_all(self, sw: PreparedSwitch) -> None:
        if sw.order:
            self._landing().move_all(sw)

    def _boundary(self):
        """A ``before_layer`` that only shows the tracer each layer's boundary (None untraced)."""
        if self.tracer is None:
            return None

        def boundary(pos: int) -> None:
            with self.tracer.layer(pos):
                pass

        return boundary

    def _prepare(self, dst: Layout, batch: StepBatch, mode: Mode, plan: SwitchPlan | None = None,
                 precopy: PreCopy | None = None) -> PreparedSwitch:
        """The switch checked (:mod:`.checks`) and ready to move; ``plan``: rank 0's, else planned here."""
        t0 = time.perf_counter()
        with self.tracer.span("prepare") if self.tracer is not None else contextlib.nullcontext():
            check_batch(self.model, batch)
            if plan is None:
                plan = self.plan_switch(dst, batch, mode, precopy=precopy)
            check_plan(plan, self.model, dst, mode, batch, precopy)
            sw = prepare(self.model, plan, self.movers, lambda: self.io, batch, precopy)
        sw.host_s = time.perf_counter() - t0
        return sw

    def _splash(self, sw: PreparedSwitch, batch: StepBatch, tokens: torch.Tensor) -> torch.Tensor:
        """``splash``: layer i+1's transfer starts right before layer i computes, and layer i lands
        right before it computes; the deferred layer computes in its source layout and moves beside
        the last layer, landing after the step."""
        m = self.model
        landing = self._landing() if sw.order else None
        last = len(m.layers) - 1
        next_moving = _next_moving(len(m.layers), set(sw.order) - {sw.deferred})
        flight: dict[int, LayerMove] = {}
        reserved = False

        def at_layer(pos: int) -> None:
            nonlocal reserved
            reserved = True  # Model.step reserved the step's pages before its first layer
            if pos in next_moving.moving:
                landing.land(sw, flight.pop(pos, None) or landing.start(sw, pos))
            if pos == last and sw.deferred is not None:  # beside the last layer: the one nothing hid
                flight[sw.deferred] = landing.start(sw, sw.deferred)
            upcoming = next_moving.after[pos]  # its transfer overlaps this layer's computation
            if upcoming is not None and upcoming not in flight:
                flight[upcoming] = landing.start(sw, upcoming)

        def before_layer(pos: int) -> None:
            if self.tracer is None:
                return at_layer(pos)
            with self.tracer.layer(pos):
                at_layer(pos)

        if landing is not None:
            landing.begin()
        try:
            logits = m.step(batch, tokens, layouts=list(sw.computes_in), before_layer=before_layer)
            if sw.deferred is not None:
                landing.land(sw, flight.pop(sw.deferred))
            return logits
        except BaseException:
            for lm in flight.values():
                Landing.rollback(lm)
            if reserved:
                release_new_pages(m, batch, sw.computes_in)
            raise

    def _failed(self, sw: PreparedSwitch, exc: TransferError) -> SwitchFailed:
        layers = self.model.layers
        switched = tuple(layers[p].index for p in sw.order if layers[p].layout is sw.dst)
        unswitched = tuple(layers[p].index for p in sw.order if layers[p].layout is not sw.dst)
        return SwitchFailed(
            f"switch {sw.src}→{sw.dst} failed at layer {exc.layer}, state {exc.state} ({exc.primitive}): {exc.cause}. "
            f"Rolled back: layers {list(switched)} hold {sw.dst}, layers {list(unswitched)} their source layout; "
            "every request's history is intact and the step's new pages were released",
            layer=exc.layer, state=exc.state, dst=sw.dst, switched=switched, unswitched=unswitched)


@dataclasses.dataclass(frozen=True)
class _NextMoving:
    moving: set[int]  # positions of the layers that move during the step (not the deferred one)
    after: dict[int, int | None]  # per position, the first moving layer after it


def _next_moving(count: int, moving: set[int]) -> _NextMoving:
    after, nxt = {}, None
    for pos in reversed(range(count)):
        after[pos] = nxt
        if pos in moving:
            nxt = pos
    return _NextMoving(moving, after)


def _layout(value: Layout | str) -> Layout:
    return Layout.parse(value) if isinstance(value, str) else Layout(value)
