"""What state movers share: the side communicator and stream, waits with a timeout, fault
injection, and the :class:`StateMover` contract a new kind of state implements.

The StateMover contract (how a state joins a live switch)
--------------------------------------------------------

The executor moves one layer at a time. For each state of the layer's
:class:`~splash_core.planning.manifest.LayerPlan` it asks the mover that lists that state in ``states``
(one mover may cover several states that share storage, as KV and indexer keys share pages)::

    t = mover.start(layer, plans, dst, io)   # on the side stream: allocate destination storage,
                                             # pack, launch async collectives
    mover.finish(t, io)                      # wait (io.wait), write the destination copy;
                                             # the source is still untouched
    layer.set_layout(dst, **t.layout_args)   # the layer now computes from the destination copy
    mover.retire(t)                          # free the source copy (old pages, old replicas)
    mover.rollback(t)                        # instead of set_layout/retire when anything failed:
                                             # free what finish allocated, keep the source

- ``plans`` maps each of the mover's states to its :class:`~splash_core.planning.manifest.StatePlan`
  (``plans[s].primitive``, ``plans[s].rank(io.rank)`` with kept / freed / fetched / sources /
  sends). Every rank issues the same collectives in the same order, ranks with nothing to send
  included; collectives go through ``io.all_gather`` / ``io.all_to_all`` (the side
  communicator, async) and are waited with ``io.wait``, which applies the timeout and the
  injected faults and turns any failure into a :class:`TransferError` naming the layer and state.
- ``start`` and ``finish`` must not change the source state; what they allocate for the
  destination (the layer does not compute before it lands, so nothing reads it early) is
  recorded in the transfer so ``rollback`` can free it, also when ``start`` itself fails
  half-way; ``retire`` cannot fail.
- ``t.received_bytes`` / ``t.group_bytes`` (per state) feed the report.
- Optional: ``mover.prepare(layer, plans, rank, T, io)``, called when the executor plans a
  switch (once per layer kind, with one layer of the kind; ``io`` is None when the switch is
  planned before the executor's first one made the side communicator), precomputes what every
  layer of the kind shares, so the step's per-layer ``start`` does only the layer's own work.

The recurrent (KDA) state moves by the same steps with the keys ``(request_id, shard)``:
:class:`~splash_core.runtime.switch.recurrent.RecurrentMover`, one of the default movers.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Any, Mapping, Protocol

import numpy as np
import torch

from ...layouts import Layout, State
from ...planning.manifest import StatePlan
from ...platform.device import to_device
from ...platform.interfaces import Collectives, PeerBuffers, StreamOps, Work
from .errors import InjectedFault, TransferError
from .tracing import QUIET, SwitchTracer


@dataclasses.dataclass(frozen=True)
class Fault:
    """A failure to inject (tests): the collective of ``state`` at model layer ``layer`` fails
    on ``ranks`` (None: every rank).

    ``hang=False``: the collective runs, then reports an error on those ranks (a collective that
    fails everywhere: use ``ranks=None``, or the other ranks carry on alone). ``hang=True``: those
    ranks stop issuing side collectives from that one on (a hung peer) and fail when they would
    wait; their peers wait until the executor's timeout, so set one. The side communicator is
    unusable after a hang."""

    layer: int
    state: State
    ranks: frozenset[int] | None = None
    hang: bool = False

    def hits(self, layer: int, state: State, rank: int) -> bool:
        return (layer == self.layer and state is State(self.state)
                and (self.ranks is None or rank in self.ranks))


BARRIER_TIMEOUT_S = 600.0  # a peer barrier's wait where the executor sets none (a collective library's usual default timeout)


class _Ordered:
    """The work of a peer barrier: already in the stream's order, nothing more to wait for."""

    def wait(self, timeout=None) -> bool:
        return True


_ORDERED = _Ordered()


@dataclasses.dataclass
class Pending:
    """An issued (or, under a hang fault, withheld) collective."""

    work: Work | None
    layer: int
    state: State
    primitive: str
    withheld: bool = False


class TransferContext:
    """Rank, side communicator, streams and kernels for the movers of one executor."""

    def __init__(self, *, rank: int, T: int, device, collectives: Collectives, streams: StreamOps,
                 side_stream, kernels, host: Collectives, timeout_s: float | None = None,
                 fault: Fault | None = None, peers: PeerBuffers | None = None, tracer: SwitchTracer = QUIET):
        """``host``: collectives on host memory, for what ranks agree on before moving;
        ``peers``: the group's shared KV pools, which pages are pulled out of (None: pages move
        by collectives); ``tracer``: sees the issues, waits, pulls, packs and unpacks."""
        self.rank, self.T, self.device = rank, T, device
        self.collectives, self.streams, self.side_stream = collectives, streams, side_stream
        self.kernels, self.timeout_s, self.fault = kernels, timeout_s, fault
        self.host, self.peers, self.tracer = host, peers, tracer
        self.hung = False  # a hang fault fired: nothing more is issued on the side communicator
        self._flags: dict[State, torch.Tensor] = {}  # per state: the tensor of its pulls' collective
        self._epoch = 0  # the last peer barrier's (every rank counts alike)

    def gather_buffer(self, role, out_shape, dtype: torch.dtype, *, layer: int, state: State) -> torch.Tensor | None:
        """The receive tensor of an all-gather in place (rank r's slot, rows ``[r n, (r+1) n)`` of
        ``out_shape[0] = T n``, is its send buffer: fill it, then :meth:`all_gather` from it) in
        role ``role``'s transfer buffer, memory the side collectives move without processors,
        or None where they have none (then gather from any tensor into a new one). The buffer
        is reused by the next layer's transfer: read it before that one starts. One that
        cannot be made (registration is a collective) raises :class:`TransferError` naming
        ``layer`` and ``state``."""
        buffers = getattr(self.collectives, "transfer_buffers", None)
        if buffers is None:
            return None
        nbytes = math.prod(out_shape) * dtype.itemsize
        try:
            buf = buffers.get(role, nbytes)
        except Exception as exc:
            raise TransferError(layer, state, "all_gather", f"transfer buffer: {type(exc).__name__}: {exc}") from exc
        return buf.view(dtype).view(out_shape)

    @property
    def buffered(self) -> bool:
        """Whether the side collectives have transfer buffers (:meth:`gather_buffer` gives one)."""
        return getattr(self.collectives, "transfer_buffers", None) is not None

    def own_slot(self, out: torch.Tensor) -> torch.Tensor:
        """This rank's rows of an all-gather's receive tensor (its send buffer when in place)."""
        n = out.shape[0] // self.T
        return out[self.rank * n: (self.rank + 1) * n]

    def index(self, array: np.ndarray) -> torch.Tensor:
        """An int32 index tensor on the device (:func:`~splash_core.platform.device.to_device`:
        copied without blocking, so issuing a layer's transfer never waits for the streams)."""
        return to_device(array, self.device, torch.int32)

    def pack(self, cache: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Pages ``index`` of ``cache`` gathered into one buffer (``MLAKernels.pack``)."""
        with self.tracer.span("pack"):
            return self.kernels.pack(cache, index, out=out) if out is not None else self.kernels.pack(cache, index)

    def unpack(self, cache: torch.Tensor, index: torch.Tensor, data: torch.Tensor) -> None:
        """Rows of ``data`` written to pages ``index`` of ``cache`` (``MLAKernels.unpack``)."""
        with self.tracer.span("unpack"):
            self.kernels.unpack(cache, index, data)

    def _issue(self, layer: int, state: State, primitive: str, launch) -> Pending:
        with self.tracer.span("issue"):
            return self._issue_now(layer, state, primitive, launch)

    def _issue_now(self, layer: int, state: State, primitive: str, launch) -> Pending:
        if self.hung or (self.fault is not None and self.fault.hang and self.fault.hits(layer, state, self.rank)):
            self.hung = True  # a hung rank issues nothing after this (issuing later ones would mismatch peers)
            return Pending(None, layer, state, primitive, withheld=True)
        try:
            return Pending(launch(), layer, state, primitive)
        except Exception as exc:  # a collective that cannot even be issued
            raise TransferError(layer, state, primitive, f"{type(exc).__name__}: {exc}") from exc

    def all_gather(self, out, inp, *, layer: int, state: State) -> Pending:
        return self._issue(layer, state, "all_gather",
                           lambda: self.collectives.all_gather_into(out, inp, async_op=True))

    def all_to_all(self, out, inp, out_splits, in_splits, *, layer: int, state: State) -> Pending:
        return self._issue(layer, state, "all_to_all", lambda: self.collectives.all_to_all(
            out, inp, [int(s) for s in out_splits], [int(s) for s in in_splits], async_op=True))

    def pull(self, source: int, runs: np.ndarray, *, layer: int, state: State) -> None:
        """Pull byte ``runs`` ([k, 6] copies, as :meth:`PeerBuffers.pull` takes them) out of
        ``source``'s shared buffer into this rank's, on the current stream (:meth:`PeerBuffers.pull`); a pull that
        cannot be issued raises :class:`TransferError` naming ``layer`` and ``state``. A hung rank
        issues nothing."""
        if self.hung:
            return
        try:
            with self.tracer.span("pull"):
                self.peers.pull(source, runs)
        except Exception as exc:
            raise TransferError(layer, state, "pull", f"from rank {source}: {type(exc).__name__}: {exc}") from exc

    def rendezvous(self, *, layer: int, state: State) -> Pending:
        """A barrier of the group on the current stream: it completes once every rank's side
        stream got to it. Before pulls, so no rank reads a peer's pages before the peer's writes to
        them (the step's, for a layer that moves after it); behind them, so no rank frees pages a
        peer still reads. Through the peer memory's own barrier where it has one (no processor
        held while waiting), else a one-element collective on the side communicator. Failures,
        timeouts and injected faults surface here or in :meth:`wait`."""
        barrier = getattr(self.peers, "barrier", None)
        if barrier is not None:
            self._epoch += 1
            epoch, timeout = self._epoch, self.timeout_s or BARRIER_TIMEOUT_S

            def launch():
                barrier(epoch, timeout)
                return _ORDERED

            return self._issue(layer, state, "pull", launch)
        if state not in self._flags:
            self._flags[state] = torch.zeros(1, device=self.device)
        flag = self._flags[state]
        return self._issue(layer, state, "pull", lambda: self.collectives.all_reduce(flag, async_op=True))

    def wait(self, pending: Pending) -> None:
        """Make the current stream wait for the collective (the host too on host backends), or
        raise :class:`TransferError` for a failure, a timeout or an injected fault."""
        where = (pending.layer, pending.state, pending.primitive)
        if pending.withheld:
            raise TransferError(*where, "injected fault: this rank never issued the collective")
        try:
            with self.tracer.span("wait"):
                if self.timeout_s is None:
                    pending.work.wait()
                else:
                    pending.work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:
            raise TransferError(*where, f"{type(exc).__name__}: {exc}") from exc
        if self.fault is not None and not self.fault.hang and self.fault.hits(pending.layer, pending.state, self.rank):
            raise TransferError(*where, str(InjectedFault("injected fault after the collective")))


@dataclasses.dataclass
class Transfer:
    """One mover's move of one layer, from ``start`` until ``retire`` or ``rollback``."""

    layer: Any
    states: tuple[State, ...]
    primitives: dict[State, str]
    received_bytes: dict[State, int]
    group_bytes: dict[State, int]
    layout_args: dict = dataclasses.field(default_factory=dict)  # for layer.set_layout(dst, **...)
    data: Any = None  # the mover's own


class StateMover(Protocol):
    """Moves some states of one layer during a switch (see the module docstring)."""

    states: tuple[State, ...]

    def start(self, layer, plans: Mapping[State, StatePlan], dst: Layout, io: TransferContext) -> Transfer: ...

    def finish(self, transfer: Transfer, io: TransferContext) -> None: ...

    def retire(self, transfer: Transfer) -> None: ...

    def rollback(self, transfer: Transfer) -> None: ...


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """1-byte formats (fp8) as uint8, so packing and collectives work on every device."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t
