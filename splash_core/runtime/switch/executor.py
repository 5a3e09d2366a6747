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

import collections
import contextlib
import dataclasses
import time
import warnings
from typing import Any

import numpy as np
import torch

from ...layouts import Layout, Primitive
from ...planning.manifest import LayerPlan, Manifest, plan_switch
from ...profiles.transfer import TransferConfig
from ..step_batch import StepBatch
from .errors import SwitchFailed, SwitchRefused, TransferError
from .modes import Mode
from .pages_mover import PagesMover
from .planning import SwitchPlan, budget_refusal, check_pools, history_batch, layer_plans, peak_bytes, plan_layers
from .precopy import PreCopy
from .recurrent import RecurrentMover
from .report import LayerReport, SwitchReport
from .tracing import QUIET, SwitchTracer
from .transfer import Fault, StateMover, Transfer, TransferContext
from .weights_mover import WeightsMover

_CACHED_PLANS = 8  # a back-and-forth between layouts, or a plan made one step ahead, stays cached


def default_movers(transfer: TransferConfig = TransferConfig()) -> list[StateMover]:
    """Movers for every state: weights, KV + indexer pages (MLA, chunked and pulled as
    ``transfer`` says), recurrent state (KDA)."""
    return [WeightsMover(), PagesMover(transfer), RecurrentMover()]


@dataclasses.dataclass
class _LayerMove:
    layer: Any
    events: dict  # t_start, t_done (side stream), w0, w1 (compute stream)
    transfers: list[tuple[StateMover, Transfer]] = dataclasses.field(default_factory=list)
    host_s: float = 0.0  # host time issuing and landing it


@dataclasses.dataclass
class _Switch:
    """One switch in progress."""

    dst: Layout
    src: Layout | str
    order: tuple[int, ...]  # positions of the moving layers in the model
    plan_ms: float
    deferred: int | None = None  # position of the layer that computes in its source layout, then moves
    computes_in: tuple[Layout, ...] = ()  # per layer, the layout it computes the step in
    landed: list[_LayerMove] = dataclasses.field(default_factory=list)
    host_s: float = 0.0  # host time of the checks before anything moved (planning included)
    # by layer index: each mover with the plans of its states (shared by the layers of a kind)
    movers: dict[int, tuple[tuple[StateMover, dict], ...]] = dataclasses.field(default_factory=dict)
    precopy: PreCopy | None = None  # the pre-copy this switch hands off: its layers adopt their copies as they land


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
        self.budget_bytes, self.reserve_bytes = budget_bytes, reserve_bytes
        self.timeout_s, self.fault = timeout_s, fault
        self.movers = default_movers(transfer) if movers is None else list(movers)
        self._io: TransferContext | None = None
        self._cache: collections.OrderedDict[tuple, dict[Layout, Manifest]] = collections.OrderedDict()

    # ---- planning ---------------------------------------------------------------------

    def plans(self, dst: Layout | str, batch: StepBatch, *, after_step: bool = False,
              layers: tuple[int, ...] | None = None, copied: np.ndarray | None = None,
              copied_layers: tuple[int, ...] | None = None) -> dict[Layout, Manifest]:
        """The manifests the switch to ``dst`` at ``batch``'s step would execute, one per source
        layout among the layers not in ``dst`` (or among ``layers``, by model index), of the
        histories before the step (or ``after_step``), this rank's key arrays and the movers'
        routes computed. The last few are cached by (destination, layer layouts, requests' ids,
        owners, starts and, after the step, rows). ``copied``: each request's leading pages a
        pre-copy placed (:meth:`PreCopy.copied_pages`), in ``copied_layers`` (None: every layer;
        :func:`~.planning.plan_layers`): the handoff's manifests."""
        manifests = self._manifests(_layout(dst), batch, after_step, layers, copied, copied_layers)
        self._ready(manifests)
        return manifests

    def _manifests(self, dst: Layout, batch: StepBatch, after_step: bool = False,
                   layers: tuple[int, ...] | None = None, copied: np.ndarray | None = None,
                   copied_layers: tuple[int, ...] | None = None) -> dict[Layout, Manifest]:
        """:meth:`plans` without this rank's part (what any rank plans alike), cached. ``copied``:
        the leading pages of each request a pre-copy placed already (in ``copied_layers``)."""
        key = (dst, tuple(layer.layout for layer in self.model.layers), batch.ids.tobytes(),
               batch.owners.tobytes(), batch.starts.tobytes(), batch.T, batch.page_size,
               batch.rows.tobytes() if after_step else None, layers, None if copied is None else copied.tobytes(),
               copied_layers)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        manifests = plan_layers(self.model, dst, batch, after_step=after_step, layers=layers, copied=copied,
                                copied_layers=copied_layers)
        self._cache[key] = manifests
        while len(self._cache) > _CACHED_PLANS:
            self._cache.popitem(last=False)
        return manifests

    def _ready(self, manifests: dict[Layout, Manifest]) -> None:
        """This rank's key arrays and the movers' per-kind routes of ``manifests`` (each built
        once per plan: a layer's transfer then does only that layer's own work)."""
        layers = {layer.index: layer for layer in self.model.layers}
        for manifest in manifests.values():
            for lp in manifest.kinds().values():
                for plan in lp.states.values():
                    plan.rank(self.model.rank)
                for mover in self.movers:
                    prepare = getattr(mover, "prepare", None)
                    mine = {s: p for s, p in lp.states.items() if s in mover.states}
                    if prepare is not None and mine:
                        prepare(layers[lp.index], mine, self.model.rank, self.model.T, self._io)

    def plan_switch(self, dst: Layout | str, batch: StepBatch, mode: Mode | str = Mode.SPLASH, *,
                    check_eq5: bool = True, precopy: PreCopy | None = None) -> SwitchPlan:
        """The switching step to ``dst`` at ``batch``'s step in ``mode``, as :meth:`step` executes
        it: the manifests, the layer that moves after the step (and its manifests of the
        histories after it) and, unless ``check_eq5`` is False (the caller's decision already
        checked it), Eq 5 against ``budget_bytes``. Pure given the model's layer layouts: rank 0
        plans it and every rank executes the same plan (``step(..., plan=...)``). ``precopy``: the
        pre-copy to ``dst`` this step hands off; its copied pages count as held, so only the dirty
        tails move (and Eq 5 counts the copies as held), and the layers it has not copied yet (it
        hands off before completing) move whole."""
        dst, mode, m = _layout(dst), Mode.parse(mode), self.model
        layouts = tuple(layer.layout for layer in m.layers)
        key = SwitchPlan.key_of(batch)
        copied, held = self._copied(precopy, dst, batch)
        order = tuple(pos for pos, layout in enumerate(layouts) if layout is not dst)
        if not order:
            return SwitchPlan(dst, mode, layouts, key, {}, copied=copied, copied_layers=held)
        t0 = time.perf_counter()
        manifests = self._manifests(dst, batch, copied=copied, copied_layers=held)
        plans = layer_plans(manifests)
        deferred, after = None, None
        if self._defers(mode, order[0], plans[m.layers[order[0]].index]):
            deferred = order[0]
            after = self._manifests(dst, batch, after_step=True, layers=(m.layers[deferred].index,), copied=copied,
                                    copied_layers=held)
            plans.update(layer_plans(after))
        refusal = None
        if check_eq5 and self.budget_bytes is not None:
            peak = peak_bytes(m, dst, batch, manifests, plans if deferred is not None else None)
            refusal = budget_refusal(peak, self.budget_bytes, self.reserve_bytes)
        return SwitchPlan(dst, mode, layouts, key, manifests, deferred, after,
                          (time.perf_counter() - t0) * 1e3, refusal, copied, held)

    @staticmethod
    def _copied(precopy: PreCopy | None, dst: Layout, batch: StepBatch) -> tuple[np.ndarray | None, tuple | None]:
        """The pages ``precopy`` placed for ``batch``'s requests, once it may hand off to ``dst``,
        and the layers it placed them in (None: every layer, it completed)."""
        if precopy is None:
            return None, None
        if precopy.dst is not dst or precopy.cancelled:
            state = "cancelled" if precopy.cancelled else f"not to {dst}"
            raise ValueError(f"the pre-copy to {precopy.dst} cannot hand off a switch to {dst} ({state})")
        precopy.check(batch)
        return precopy.copied_pages(batch), None if precopy.complete else tuple(sorted(precopy.holding))

    def precopy(self, dst: Layout | str, batch: StepBatch, steps: int) -> PreCopy:
        """Begin a pre-copy to ``dst`` before ``batch``'s step, copying over ``steps`` steps
        (:class:`~.precopy.PreCopy`: run those steps with its ``step``, then hand off with
        ``step(..., precopy=...)``, or ``cancel`` it). Every rank, with the same arguments."""
        return PreCopy(self, _layout(dst), batch, steps)

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
        exposed = None
        try:
            if mode is Mode.READY:
                self._move_all(sw)
                streams.synchronize()
                start.record()
                logits = self.model.step(batch, tokens, before_layer=self._boundary())
                exposed = 0.0
            elif mode is Mode.BLOCKING:
                x0, x1 = streams.new_event(timing=True), streams.new_event(timing=True)
                x0.record()
                self._move_all(sw)
                x1.record()
                logits = self.model.step(batch, tokens, before_layer=self._boundary())
                exposed = x0, x1
            else:
                logits = self._splash(sw, batch, tokens)
        except TransferError as exc:
            raise self._failed(sw, exc) from exc
        if self.tracer is not None:
            self.tracer.step_end()
        end.record()
        end.synchronize()
        return logits, self._report(sw, mode, start.elapsed_time(end), exposed)

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
        return self._report(sw, Mode.BLOCKING, ms, ms)

    # ---- preparation ------------------------------------------------------------------

    @property
    def io(self) -> TransferContext:
        """The side communicator and stream (created on the first switch: a collective)."""
        if self._io is None:
            self.use_side(self.ctx.side_collectives(self.transfer), self.ctx.streams.new_stream())
        self._io.timeout_s, self._io.fault = self.timeout_s, self.fault
        return self._io

    def use_side(self, collectives, side_stream) -> None:
        """Move state over ``collectives`` on ``side_stream`` (instead of the rank's side
        communicator and a new stream: benchmark variants). Collective: every rank, before
        the first switch."""
        ctx = self.ctx
        host = ctx.host_collectives()
        self._io = TransferContext(rank=ctx.rank, T=ctx.world_size, device=ctx.device, collectives=collectives,
                                   streams=ctx.streams, side_stream=side_stream, kernels=self.model.kernels,
                                   host=host, peers=self._share_pool(host), tracer=self.tracer or QUIET)

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

    def _span(self, name: str):
        return self.tracer.span(name) if self.tracer is not None else contextlib.nullcontext()

    def _boundary(self):
        """A ``before_layer`` that only shows the tracer each layer's boundary (None untraced)."""
        if self.tracer is None:
            return None

        def boundary(pos: int) -> None:
            with self.tracer.layer(pos):
                pass

        return boundary

    def _prepare(self, dst: Layout, batch: StepBatch, mode: Mode, plan: SwitchPlan | None = None,
                 precopy: PreCopy | None = None) -> _Switch:
        t0 = time.perf_counter()
        with self._span("prepare"):
            sw = self._check(dst, batch, mode, plan, precopy)
        sw.host_s = time.perf_counter() - t0
        return sw

    def _check(self, dst: Layout, batch: StepBatch, mode: Mode, plan: SwitchPlan | None,
               precopy: PreCopy | None = None) -> _Switch:
        m = self.model
        if batch.T != m.T or batch.page_size != m.page_size:
            raise ValueError(f"batch for T={batch.T}, page {batch.page_size}; model has T={m.T}, page {m.page_size}")
        layouts = tuple(layer.layout for layer in m.layers)
        if plan is None:
            plan = self.plan_switch(dst, batch, mode, precopy=precopy)
        elif plan.dst is not dst or plan.mode is not mode or plan.matches(layouts, batch):
            raise ValueError(f"the switch plan (to {plan.dst}, {plan.mode}) is not this step's (to {dst}, {mode}): "
                             f"{plan.matches(layouts, batch) or 'another destination or mode'}")
        copied, held = self._copied(precopy, dst, batch)
        if ((copied is None) != (plan.copied is None) or held != plan.copied_layers
                or (copied is not None and not np.array_equal(copied, plan.copied))):
            raise ValueError("the switch plan was not planned with this step's pre-copy (plan_switch(..., precopy=))")
        src = layouts[0] if len(set(layouts)) == 1 else "mixed"
        order = tuple(pos for pos, layout in enumerate(layouts) if layout is not dst)
        if not order:
            return _Switch(dst, src, (), 0.0, computes_in=(dst,) * len(m.layers))
        io = self.io  # every rank creates the side communicator here (the movers' routes depend on it)
        t0 = time.perf_counter()
        self._ready(plan.manifests)
        if plan.deferred_manifests:
            self._ready(plan.deferred_manifests)
        plans = plan.layer_plans()
        computes_in = list(dst if pos in order and pos != plan.deferred else layout
                           for pos, layout in enumerate(layouts))
        sw = _Switch(dst, src, order, plan.plan_ms + (time.perf_counter() - t0) * 1e3, plan.deferred,
                     tuple(computes_in), precopy=precopy)
        per_kind: dict[int, tuple] = {}  # layers of a kind share one states mapping
        for lp in plans.values():
            if id(lp.states) not in per_kind:
                per_kind[id(lp.states)] = self._assign(lp)
            sw.movers[lp.index] = per_kind[id(lp.states)]
        if plan.refusal:
            raise self._refused(sw, mode, plan.refusal)
        pools = check_pools(m, io.host, dst, batch, plans,
                            {layer.index: layout for layer, layout in zip(m.layers, computes_in)},
                            precopy.aside() if precopy is not None else None)
        stray = pools.stray_error()
        if stray:
            raise ValueError(stray)
        reason = pools.refusal()
        if reason:
            raise self._refused(sw, mode, reason)
        return sw

    def _defers(self, mode: Mode, first: int, plan: LayerPlan) -> bool:
        """Whether the first moving layer (position ``first``, plan ``plan``) computes the step in
        its source layout and moves last: in ``splash``, where a later layer exists to hide its
        transfer and it moves something over the network (a discard is ready at once)."""
        return (mode is Mode.SPLASH and self.transfer.defer_first and first < len(self.model.layers) - 1
                and any(p.primitive is not Primitive.DISCARD for p in plan.states.values()))

    def _assign(self, lp: LayerPlan) -> tuple[tuple[StateMover, dict], ...]:
        """Each mover that moves some of ``lp``'s states, with their plans."""
        missing = set(lp.states) - {s for mover in self.movers for s in mover.states}
        if missing:
            raise ValueError(f"layer {lp.index} ({lp.kind}) has state {sorted(map(str, missing))} that no mover "
                             f"moves; pass one to SwitchExecutor(movers=...) (see switch.transfer.StateMover)")
        return tuple((mover, mine) for mover in self.movers
                     if (mine := {s: lp.states[s] for s in mover.states if s in lp.states}))

    def _refused(self, sw: _Switch, mode: Mode, reason: str) -> SwitchRefused:
        report = SwitchReport(sw.src, sw.dst, mode, plan_ms=sw.plan_ms, refused=True,
                              reason=f"switch {sw.src}→{sw.dst} refused, nothing moved: {reason}")
        return SwitchRefused(report.reason, report)

    # ---- moving -----------------------------------------------------------------------

    def _begin(self) -> None:
        """The side stream starts after everything the compute stream issued before the switch."""
        io, streams = self.io, self.ctx.streams
        ready = streams.new_event()
        ready.record()
        ready.wait(io.side_stream)

    def _move_all(self, sw: _Switch) -> None:
        if not sw.order:
            return
        self._begin()
        for pos in sw.order:
            self._land(sw, self._start(sw, pos))

    def _splash(self, sw: _Switch, batch: StepBatch, tokens: torch.Tensor) -> torch.Tensor:
        m = self.model
        last = len(m.layers) - 1
        moving = set(sw.order) - {sw.deferred}
        next_moving, after = {}, None
        for pos in reversed(range(len(m.layers))):  # the first moving layer after each position
            next_moving[pos] = after
            if pos in moving:
                after = pos
        flight: dict[int, _LayerMove] = {}
        reserved = False

        def before_layer(pos: int) -> None:
            if self.tracer is None:
                return at_layer(pos)
            with self.tracer.layer(pos):
                at_layer(pos)

        def at_layer(pos: int) -> None:
            nonlocal reserved
            reserved = True  # Model.step reserved the step's pages before its first layer
            if pos in moving:
                self._land(sw, flight.pop(pos, None) or self._start(sw, pos))
            if pos == last and sw.deferred is not None:  # beside the last layer: the one nothing hid
                flight[sw.deferred] = self._start(sw, sw.deferred)
            upcoming = next_moving[pos]  # its transfer overlaps this layer's computation
            if upcoming is not None and upcoming not in flight:
                flight[upcoming] = self._start(sw, upcoming)

        if sw.order:
            self._begin()
        try:
            logits = m.step(batch, tokens, layouts=list(sw.computes_in), before_layer=before_layer)
            if sw.deferred is not None:
                self._land(sw, flight.pop(sw.deferred))
            return logits
        except BaseException:
            for lm in flight.values():
                self._rollback(lm)
            if reserved:
                self._release_new_pages(batch, sw.computes_in)
            raise

    def _start(self, sw: _Switch, pos: int) -> _LayerMove:
        with self._span("start"):
            return self._start_now(sw, pos)

    def _start_now(self, sw: _Switch, pos: int) -> _LayerMove:
        t0 = time.perf_counter()
        layer, io, streams = self.model.layers[pos], self.io, self.ctx.streams
        lm = _LayerMove(layer, {k: streams.new_event(timing=True) for k in ("t_start", "t_done", "w0", "w1")})
        if self.transfer.align_transfers:
            reached = streams.new_event()
            reached.record()  # on the compute stream, where the layer this transfer overlaps begins
            reached.wait(io.side_stream)
        with streams.use_stream(io.side_stream):
            lm.events["t_start"].record(io.side_stream)
            try:
                for mover, plans in sw.movers[layer.index]:
                    lm.transfers.append((mover, mover.start(layer, plans, sw.dst, io)))
            except BaseException:
                self._rollback(lm)
                raise
        lm.host_s = time.perf_counter() - t0
        return lm

    def _land(self, sw: _Switch, lm: _LayerMove) -> None:
        with self._span("land"):
            self._land_now(sw, lm)

    def _land_now(self, sw: _Switch, lm: _LayerMove) -> None:
        t0 = time.perf_counter()
        io, streams, ev = self.io, self.ctx.streams, lm.events
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
            self._rollback(lm)
            raise
        for mover, t in lm.transfers:  # the destination copy is live: retire the source copy
            mover.retire(t)
        if sw.precopy is not None:  # before the layer computes in dst: its pre-copied pages join
            sw.precopy.adopt(lm.layer)
        lm.host_s += time.perf_counter() - t0
        sw.landed.append(lm)

    @staticmethod
    def _rollback(lm: _LayerMove) -> None:
        for mover, t in reversed(lm.transfers):
            mover.rollback(t)
        lm.transfers = []

    def _release_new_pages(self, batch: StepBatch, computes_in) -> None:
        m = self.model
        for layer in m.paged_layers:
            for rid, pages in m.new_pages(batch, list(computes_in))[layer.index]:
                layer.kv.free(rid, pages)

    def _failed(self, sw: _Switch, exc: TransferError) -> SwitchFailed:
        layers = self.model.layers
        switched = tuple(layers[p].index for p in sw.order if layers[p].layout is sw.dst)
        unswitched = tuple(layers[p].index for p in sw.order if layers[p].layout is not sw.dst)
        return SwitchFailed(
            f"switch {sw.src}→{sw.dst} failed at layer {exc.layer}, state {exc.state} ({exc.primitive}): {exc.cause}. "
            f"Rolled back: layers {list(switched)} hold {sw.dst}, layers {list(unswitched)} their source layout; "
            "every request's history is intact and the step's new pages were released",
            layer=exc.layer, state=exc.state, dst=sw.dst, switched=switched, unswitched=unswitched)

    # ---- report -----------------------------------------------------------------------

    def _report(self, sw: _Switch, mode: Mode, step_ms: float, exposed) -> SwitchReport:
        layers, received, group = [], {}, {}
        for lm in sw.landed:
            ev, got, prims = lm.events, {}, {}
            for _, t in lm.transfers:
                for s in t.states:
                    name, n = s.value, t.received_bytes.get(s, 0)
                    got[name] = got.get(name, 0) + n
                    prims[name] = t.primitives[s]
                    received[name] = received.get(name, 0) + n
                    group[name] = group.get(name, 0) + t.group_bytes.get(s, 0)
            layers.append(LayerReport(lm.layer.index, prims, got, ev["t_start"].elapsed_time(ev["t_done"]),
                                      ev["w0"].elapsed_time(ev["w1"]), lm.host_s * 1e3))
        layers.sort(key=lambda r: r.index)
        if exposed is None:
            exposed_ms = float(sum(r.wait_ms for r in layers))
        elif isinstance(exposed, tuple):
            exposed_ms = exposed[0].elapsed_time(exposed[1])
        else:
            exposed_ms = float(exposed)
        host_ms = 1e3 * (sw.host_s + sum(lm.host_s for lm in sw.landed))
        deferred = self.model.layers[sw.deferred].index if sw.deferred is not None and sw.landed else None
        return SwitchReport(sw.src, sw.dst, mode, float(step_ms), exposed_ms, received, group, tuple(layers),
                            sw.plan_ms, host_ms=host_ms, deferred_layer=deferred)


def _layout(value: Layout | str) -> Layout:
    return Layout.parse(value) if isinstance(value, str) else Layout(value)
