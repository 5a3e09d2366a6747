"""A switch that spans steps: pre-copy the destination's missing KV in the background of ordinary
steps, then hand off with the dirty tail (issue 26).

A one-step switch hides layer i's transfer behind layer i−1's computation; in a decode step a
layer computes in well under a millisecond while its KV takes milliseconds to move, so almost
nothing is hidden. A pre-copy to ``dst`` started at step s instead:

1. Records, per request of step s's batch, its *copied prefix*: the pages full before step s
   (``start // page_size``). A full page is never written again, so a copy of it stays exact;
   everything after it (the partial page, the tokens appended from step s on, every request
   that joins later) is the *dirty tail*.
2. For ``steps`` steps the group keeps serving in the source layouts (an ordinary step: a decode
   step replays its captured graph) while each step copies the prefix of its share of the MLA
   layers (oldest history first: the prefix is all history that existed at step s; layer by
   layer, in model order) with the executor's own
   :class:`~.pages_mover.PagesMover`, on its side stream and side communicator, from
   :func:`~splash_core.planning.manifest.plan_precopy` plans (fetch what the destination lacks, free
   nothing). The copies land in pages held under an id of the pre-copy's own (``-1 - id``), so
   the source layout never sees them, and they count as held: before copying, every rank agrees
   (one host all-reduce) that the pages, the transit buffers and the step's new pages fit its
   pools and the Eq 5 budget; where they do not, the step copies nothing (paused), and where the
   step's new pages no longer fit beside the copies held, the pre-copy is cancelled before the
   step. A step's copies all start before it computes and land after it; over side collectives
   with reused transfer buffers (copy engines) each lands before the next starts, all queued on
   the side stream.
3. The handoff is an ordinary switching step (:meth:`SwitchExecutor.step` with
   ``precopy=``): its manifests count the copied prefixes as held by their destination holders
   (:func:`~splash_core.planning.manifest.plan_switch`'s ``copied``), so only the dirty tails, the
   weights and the recurrent state move, layer-pipelined as always; as each layer lands its
   copied pages join their requests (:meth:`PreCopy.adopt`, no copy) and its source pages
   are retired as today. A pre-copy may hand off before it completed (its steps ran out while
   memory was short): the layers it copied count their prefixes as held, the others move whole,
   as in a one-step switch.

A request that finishes during the pre-copy drops out (:meth:`PreCopy.release` frees its
copies); one that joins is all dirty tail. :meth:`PreCopy.cancel` frees every copy and changes
nothing else; a failed copy (a collective's error or timeout) rolls back what it allocated and
cancels the pre-copy: the step it ran beside is unaffected and every history stays intact. As
with the executor's switches, a failure is expected on every rank alike (a collective that fails
everywhere), and every rank runs the same pre-copy with the same batches.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import torch

from ...layouts import Layout, State
from ...planning import ownership
from ...planning.manifest import StatePlan, layer_states, plan_precopy
from ..page_keys import PageKeys
from ..step_batch import StepBatch
from .errors import TransferError
from .planning import new_pages_here
from .transfer import Transfer


def shadow_id(request: int) -> int:
    """The id a pre-copy holds ``request``'s copied pages under (never a request's own: ids are >= 0)."""
    return -1 - int(request)


@dataclasses.dataclass(frozen=True)
class PreCopyReport:
    """One step of a pre-copy on one rank: the layers whose prefixes it copied, the bytes this
    rank received (``received_bytes``) and the group did (``group_bytes``, the same on every rank),
    why it copied none (``paused``) or what failed (then the pre-copy was cancelled), and the host
    time of the pre-copy's own work in the step."""

    dst: Layout
    step: int  # steps of this pre-copy so far, this one included
    layers: tuple[int, ...]
    received_bytes: int
    complete: bool
    host_ms: float
    paused: str = ""
    failed: str = ""
    cancelled: str = ""  # why the copies had to go before the step (its new pages needed their room)
    group_bytes: int = 0

    def summary(self) -> dict:
        return {"dst": self.dst.value, "step": self.step, "layers": list(self.layers),
                "received_bytes": self.received_bytes, "group_bytes": self.group_bytes,
                "complete": self.complete, "host_ms": self.host_ms,
                "paused": self.paused, "failed": self.failed, "cancelled": self.cancelled}


class _ShadowPool:
    """A layer's pool as a pre-copy's mover sees it: the pages it sends are its requests' own; the
    pages it allocates (and frees on a rollback) are held under the shadow ids."""

    def __init__(self, kv, shadowed):
        self._kv, self._shadowed = kv, shadowed

    def __getattr__(self, name):
        return getattr(self._kv, name)

    def alloc_keys(self, keys: PageKeys) -> np.ndarray:
        return self._kv.alloc_keys(self._shadowed(keys))

    def placement(self, keys: PageKeys) -> np.ndarray:
        return self._kv.placement(self._shadowed(keys))

    def free_keys(self, keys: PageKeys) -> int:
        return self._kv.free_keys(self._shadowed(keys))


@dataclasses.dataclass(frozen=True)
class _ShadowLayer:
    index: int
    kv: _ShadowPool


class PreCopy:
    """A pre-copy to ``dst`` in progress on one rank, begun before ``batch``'s step, copying
    over ``steps`` steps (see the module docstring). Made by :meth:`SwitchExecutor.precopy`."""

    def __init__(self, executor, dst: Layout, batch: StepBatch, steps: int):
        if steps < 1:
            raise ValueError(f"a pre-copy spans at least one step (got {steps})")
        m = executor.model
        if batch.T != m.T or batch.page_size != m.page_size:
            raise ValueError(f"batch for T={batch.T}, page {batch.page_size}; model has T={m.T}, page {m.page_size}")
        self.executor, self.model, self.dst, self.steps = executor, m, dst, steps
        self.sources = {layer.index: layer.layout for layer in m.layers}  # the layouts it copies from
        self.prefix = {int(i): int(s) // m.page_size for i, s in zip(batch.ids, batch.starts)}  # pages copied
        self.owners = {int(i): int(o) for i, o in zip(batch.ids, batch.owners)}
        self.pending = [layer.index for layer in m.paged_layers if layer.layout is not dst]
        self.per_step = math.ceil(len(self.pending) / steps) if self.pending else 0
        self.holding: set[int] = set()  # layers whose copies landed and are not adopted yet
        self.steps_run = 0
        self.cancelled = False
        self._mover = next(mv for mv in executor.movers if State.KV in mv.states)
        self._plans: dict[tuple, dict[State, StatePlan]] = {}
        self._shadowed: dict[int, tuple[PageKeys, PageKeys]] = {}  # by id of the keys: (keys, their shadow twin)

    # ---- state --------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """Every layer's prefix landed: the handoff moves only dirty tails (before, the layers not
        copied move whole)."""
        return not self.pending and not self.cancelled

    @property
    def due(self) -> bool:
        """Its steps ran out: hand off if complete, else fall back (cancel, one-step switch)."""
        return self.steps_run >= self.steps

    def copied_pages(self, batch: StepBatch) -> np.ndarray:
        """Per request of ``batch`` (in order), its leading pages copied to every destination
        holder in every moving layer (0 for a request that joined later)."""
        return np.array([self.prefix.get(int(i), 0) for i in batch.ids], dtype=np.int64)

    def aside(self) -> dict[int, int]:
        """Per layer index, the pages this rank holds for the destination (under shadow ids)."""
        return {index: sum(int(self.model.pool[index].pages_of(shadow_id(rid))[0].size) for rid in self.prefix)
                for index in self.holding}

    def check(self, batch: StepBatch) -> None:
        """ValueError unless ``batch`` may run beside this pre-copy or hand it off: the layers are
        in the layouts it copies from, every request it copies is in the batch (every layer must
        copy the same requests) and they kept their owners."""
        now = {layer.index: layer.layout for layer in self.model.layers}
        if now != self.sources:
            raise ValueError(f"the pre-copy to {self.dst} copies from layer layouts "
                             f"{[str(v) for v in self.sources.values()]}, the model has {[str(v) for v in now.values()]}")
        missing = sorted(set(self.prefix) - {int(i) for i in batch.ids})
        if missing:
            raise ValueError(f"requests {missing} of the pre-copy to {self.dst} are not in the batch: release "
                             "finished requests (PreCopy.release) and put every running request in the batch")
        moved = [int(i) for i, o in zip(batch.ids, batch.owners) if self.owners.get(int(i), int(o)) != int(o)]
        if moved:
            raise ValueError(f"requests {moved} changed owner during the pre-copy to {self.dst}")

    # ---- one step beside the copy ---------------------------------------------------------

    def step(self, batch: StepBatch, tokens: torch.Tensor) -> tuple[torch.Tensor, PreCopyReport]:
        """Run ``batch``'s step in the current layouts (:meth:`Model.step`) while the next layers'
        prefixes copy on the side stream; returns the step's logits and this rank's report. A
        failed copy cancels the pre-copy (reported in ``failed``); the step is unaffected."""
        if self.cancelled:
            raise ValueError(f"the pre-copy to {self.dst} was cancelled")
        self.check(batch)
        t0 = time.perf_counter()
        layers = tuple(self.pending[: self.per_step])
        plans = self._plans_for(batch) if layers else {}
        paused, crowded = self._short(layers, plans, batch) if layers or self.holding else ("", "")
        if crowded:  # the step cannot run beside the copies: they go, the step runs as it would have
            self.cancel()
            logits = self.model.step(batch, tokens)
            self.steps_run += 1
            return logits, PreCopyReport(self.dst, self.steps_run, (), 0, False,
                                         (time.perf_counter() - t0) * 1e3, cancelled=crowded)
        if paused:
            layers = ()
        moves, failed = [], ""
        # a transfer buffer is reused by the next layer's transfer: there each copy lands before the
        # next starts (queued on the side stream); else all start, the step runs, then all land
        land_each = self.executor.io.buffered
        host_s = time.perf_counter() - t0
        try:
            if layers:
                t1 = time.perf_counter()
                self.executor.begin_side()  # the side stream starts after what the compute stream issued
                failed = self._launch(layers, plans, moves, land_each)
                host_s += time.perf_counter() - t1
            logits = self.model.step(batch, tokens)
        except BaseException:
            self._rollback(moves)
            raise
        t2 = time.perf_counter()
        if not failed and moves and not land_each:
            failed = self._finish(moves)
        if layers:  # every rank copies the same layers (the pause is agreed)
            failed = self._agree(failed)
        received = group = 0
        if failed:
            self._rollback(moves)
            self.cancel()
        else:
            for index, t in moves:
                received += sum(t.received_bytes.values())
                group += sum(t.group_bytes.values())
                self.holding.add(index)
            self.pending = self.pending[len(layers):]
        self.steps_run += 1
        host_s += time.perf_counter() - t2
        return logits, PreCopyReport(self.dst, self.steps_run, layers if not failed else (), received,
                                     self.complete, host_s * 1e3, paused, failed, group_bytes=group)

    def _plans_for(self, batch: StepBatch) -> dict[Layout, dict[State, StatePlan]]:
        """Per source layout of the pending layers, the plan copying the prefixes of ``batch``'s
        requests that have one (cached: the same until a request finishes)."""
        m = self.model
        rows = [(int(i), int(o)) for i, o in zip(batch.ids, batch.owners) if self.prefix.get(int(i), 0)]
        hist = ownership.Batch(tuple(ownership.Request(i, self.prefix[i] * m.page_size, o) for i, o in rows))
        pages = np.array([self.prefix[i] for i, _ in rows], dtype=np.int64)
        out = {}
        for src in {self.sources[index] for index in self.pending}:
            key = (src, hist)
            if key not in self._plans:
                self._plans = {k: v for k, v in self._plans.items() if k[1] == hist}  # older batches go
                plans = plan_precopy(src, self.dst, hist, m.profile, m.T, m.page_size, pages)
                prepare = getattr(self._mover, "prepare", None)
                if prepare is not None and plans:  # the routes, once for every layer of the plan
                    index = next(i for i in self.pending if self.sources[i] is src)
                    prepare(_ShadowLayer(index, _ShadowPool(m.pool[index], self._shadow)), plans, m.rank, m.T,
                            self.executor.io)
                self._plans[key] = plans
            out[src] = self._plans[key]
        return out

    def _short(self, layers, plans, batch: StepBatch) -> tuple[str, str]:
        """(why copying ``layers`` now would not fit, why the step's new pages do not fit beside
        the copies already held), each "" where they do; agreed by every rank (one host
        all-reduce). Each layer's pool must keep the step's new pages free beside the copies, and
        the attention state held (copies included), the copies' transit buffers, the step's new
        pages and the reserve must stay within the Eq 5 budget."""
        m, ex = self.model, self.executor
        rank, T = m.rank, m.T
        need = new_total = transit = 0  # bytes: a layer storing no indexer keys has smaller pages
        short_layer = crowded_layer = -1
        for index in layers:
            mine = self._layer_plans(index, plans)
            fetched = len(mine[State.KV].rank(rank).fetched)
            new = new_pages_here(self.sources[index], batch, rank, T)
            if m.pool[index].free_pages < fetched + new and short_layer < 0:
                short_layer = index
            need += fetched * m.pool[index].format.page_bytes
            transit += int(sum(p.transit_bytes[rank] for p in mine.values()))
        for layer in m.paged_layers:
            new = new_pages_here(layer.layout, batch, rank, T)
            new_total += new * layer.kv.format.page_bytes
            if layer.kv.free_pages < new and crowded_layer < 0:
                crowded_layer = layer.index
        over = 0
        if ex.budget_bytes is not None:
            held = m.nbytes()
            state = held["weights"] + held["kv"] + held["indexer"] + held["recurrent"]
            peak = state + need + new_total + transit + ex.reserve_bytes
            over = int(peak > ex.budget_bytes) * int(peak)
        table = torch.zeros(3 * T, dtype=torch.int64)
        table[rank], table[T + rank], table[2 * T + rank] = short_layer + 1, over, crowded_layer + 1
        ex.io.host.all_reduce(table)
        table = table.numpy()
        crowded = ""
        if table[2 * T:].any():
            r = int(np.flatnonzero(table[2 * T:])[0])
            crowded = (f"KV pool: rank {r} layer {int(table[2 * T + r]) - 1} needs the pages the copies hold for "
                       "the step's new tokens")
        if table[:T].any():
            r = int(np.flatnonzero(table[:T])[0])
            return (f"KV pool: rank {r} layer {int(table[r]) - 1} has too few free pages for its copies and the "
                    "step's new pages"), crowded
        if table[T: 2 * T].any():
            r, gib = int(np.flatnonzero(table[T: 2 * T])[0]), float(1 << 30)
            return (f"Eq 5: rank {r} would hold {table[T + r] / gib:.3f} GiB of attention state with the copies "
                    f"(reserve included), over its budget of {ex.budget_bytes / gib:.3f} GiB"), crowded
        return "", crowded

    def _shadow(self, keys: PageKeys) -> PageKeys:
        twin = self._shadowed.get(id(keys))
        if twin is None or twin[0] is not keys:
            twin = (keys, dataclasses.replace(keys, requests=tuple(shadow_id(r) for r in keys.requests)))
            self._shadowed[id(keys)] = twin
        return twin[1]

    def _launch(self, layers, plans, moves, land_each: bool) -> str:
        """Start the copies of ``layers`` (into ``moves``), landing each before the next where
        ``land_each``; the first failure, or ""."""
        for index in layers:
            try:
                moves.append(self._start(index, self._layer_plans(index, plans)))
            except TransferError as exc:
                return str(exc)
            if land_each:
                failed = self._finish(moves[-1:])
                if failed:
                    return failed
        return ""

    def _layer_plans(self, index: int, plans: dict[Layout, dict[State, StatePlan]]) -> dict[State, StatePlan]:
        """Layer ``index``'s plans of the copy from its source layout (no indexer plan where it stores
        no indexer keys)."""
        return layer_states(self.model.profile, index, plans[self.sources[index]])

    def _start(self, index: int, plans: dict[State, StatePlan]) -> tuple[int, Transfer]:
        io = self.executor.io
        layer = _ShadowLayer(index, _ShadowPool(self.model.pool[index], self._shadow))
        with self.model.streams.use_stream(io.side_stream):
            return index, self._mover.start(layer, plans, self.dst, io)

    def _finish(self, moves) -> str:
        """Land every started copy on the side stream; the first failure, or ""."""
        io = self.executor.io
        with self.model.streams.use_stream(io.side_stream):
            for _, t in moves:
                try:
                    self._mover.finish(t, io)
                except TransferError as exc:
                    return str(exc)
        return ""

    def _agree(self, failed: str) -> str:
        """Every rank's copies landed, or all of them cancel (one host all-reduce)."""
        flag = torch.tensor([int(bool(failed))], dtype=torch.int64)
        self.executor.io.host.all_reduce(flag)
        return failed or ("a peer's copy failed" if int(flag.item()) else "")

    def _rollback(self, moves) -> None:
        for _, t in reversed(moves):
            self._mover.rollback(t)
        moves.clear()

    # ---- dropping out, cancelling, handing off ---------------------------------------------

    def release(self, request: int) -> None:
        """``request`` finished: free its copies (call with :meth:`Model.release`, on every rank)."""
        if self.prefix.pop(int(request), None) is not None:
            self._side_done()
            for index in self.holding:
                self.model.pool[index].free(shadow_id(request))
            self._plans.clear()

    def cancel(self) -> None:
        """Free every copy; nothing else changes (on every rank)."""
        self._side_done()
        for index in self.holding:
            for rid in self.prefix:
                self.model.pool[index].free(shadow_id(rid))
        self.holding.clear()
        self.pending, self.cancelled = [], True

    def adopt(self, layer) -> None:
        """``layer`` landed in ``dst`` (the handoff): its copied pages join their requests."""
        if layer.index in self.holding:
            for rid in self.prefix:
                layer.kv.adopt(shadow_id(rid), rid)
            self.holding.discard(layer.index)

    def _side_done(self) -> None:
        """Later work on the compute stream waits for the side stream's copies (pages freed here may
        be handed out again at once)."""
        if not self.executor.has_side:
            return
        done = self.model.streams.new_event()
        done.record(self.executor.io.side_stream)
        done.wait()
