"""Rank-side work of ``bench/switch_bench.py``; functions taking ``ctx`` run on every rank of a
:class:`~splash_core.runtime.spawn.RankPool` and return this rank's samples (the driver keeps,
per sample, the slowest rank's time).

The workload is the paper's switch study: B requests with ``context`` tokens each, all in one
chunked-prefill step of ``rows`` query rows per request over a history of ``context - rows``
tokens (synthetic, unit-scale latents). The chunk stays inside the last history page, so the
step can be repeated: every repetition rewrites the same slots and the history stays the same.

- :func:`primitive_costs`: one layer's transfer per state and direction (paper §5.4, Figure
  5b/c): the mover's start/finish on a quiet group, then rolled back, so the source state stays
  and the next sample starts alike. On an accelerator the side stream is first held behind
  ``gate_ms`` of matmuls and a one-element all-reduce, so the host's bookkeeping is done before
  the device starts, the ranks start together, and the time is the device's (as in a pipelined
  switch, where the host runs ahead and the compute stream aligns the ranks); ``host_ms`` is the host-inclusive time. A bare all-gather / all-to-all of the same
  bytes on the same communicator is timed beside each, behind the same gate. Also the per-layer step time of each
  layout at each candidate context, for sizing the overhead run.
- :func:`switch_overhead`: matched target-ready / blocking / SPLASH runs of every direction
  (§5.5, appendix F.2), a→b and b→a alternating so no run needs a reset. The first (warm-up) run
  of a pair plans its manifests (their host time is reported as ``plan_ms``); the timed runs
  reuse them, as a step whose switch the scheduler already planned to cost it. Each SPLASH
  step's waits and the host time of its switch work (``SwitchReport.host_ms``) are kept too,
  and each ready and SPLASH step's :func:`step_parts` (a :class:`~.layer_probe.LayerProbe`
  as the executor's tracer), so the overhead splits into its causes.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from splash_core import dtypes
from splash_core.layouts import LAYOUTS, Layout, Primitive, State
from splash_core.model.weights import SeededWeights
from splash_core.planning import ownership
from splash_core.profiles.loader import load
from splash_core.runtime.kv_pool import held_pages
from splash_core.runtime.model import Model
from splash_core.runtime.model_config import ModelConfig, RankOps
from splash_core.runtime.step_batch import StepBatch, StepRequest
from splash_core.runtime.step_timing import past_deadline, release_cached_memory
from splash_core.runtime.switch import Mode, SwitchExecutor
from splash_core.runtime.switch.planning import layer_plans

from .kernels import kernels_for
from .layer_probe import LayerProbe
from .options import transfer_config

NETWORK_STATES = (State.WEIGHTS, State.KV)


# ---- the workload ---------------------------------------------------------------------------

def synthetic_batch(batch: int, context: int, rows: int, T: int, page_size: int) -> StepBatch:
    """``batch`` requests (owners round robin) feeding ``rows`` rows after ``context - rows`` tokens."""
    if context % page_size or not 0 < rows < page_size:
        raise ValueError(f"the chunk must lie in the last page: context {context} a multiple of the page "
                         f"size {page_size}, 0 < rows {rows} < {page_size}")
    return StepBatch.build([StepRequest(i, i % T, context - rows, rows) for i in range(batch)], T, page_size)


def fill(model: Model, batch: StepBatch) -> None:
    """Give every layer exactly its layout's pages of each request's history (contents as they are)."""
    for layer in model.paged_layers:
        for rid in list(layer.kv.requests):
            layer.kv.free(rid)
        for rid, owner, start in zip(batch.ids, batch.owners, batch.starts):
            pages = np.arange(int(ownership.pages_for(int(start), model.page_size)))
            layer.kv.alloc(int(rid), held_pages(layer.layout, int(rid), int(owner), pages, model.rank, model.T))


def build(ctx, spec: dict, layers: int, max_context: int, kernels=None, peer_memory=None) -> Model:
    """The model of ``spec`` with ``layers`` layers, pools big enough for TP at ``max_context``
    (``kernels``: the MLA kernels to use instead of ``spec['kernels']``'s), in ``peer_memory``,
    or in the backend's where ``spec['transfer']`` asks for pulls."""
    profile, T = load("model", spec["model"]), ctx.world_size
    dtype = dtypes.torch_dtype(spec["dtype"])
    pages = spec["batch"] * int(ownership.pages_for(max_context, spec["page_size"])) + spec["batch"]
    peer_memory = peer_memory or (ctx.peer_memory() if transfer_config(spec.get("transfer")).peer_pulls else None)
    config = ModelConfig(profile, Layout(spec["initial"]), pages_per_layer=pages, page_size=spec["page_size"],
                         dtype=dtype, num_layers=layers)
    ops = RankOps(ctx.rank, T, ctx.device, ctx.collectives, kernels or kernels_for(ctx, dtype, spec["kernels"]),
                  peer_memory=peer_memory)
    model = Model(config, ops, SeededWeights(spec["seed"]))
    gen = torch.Generator(device=ctx.device).manual_seed(spec["seed"])
    for layer in model.paged_layers:
        layer.kv.kv.normal_(generator=gen)
    return model


def _tokens(ctx, model: Model, batch: StepBatch) -> torch.Tensor:
    gen = torch.Generator(device=ctx.device).manual_seed(1)
    return torch.randint(0, model.profile.vocab_size, (batch.num_rows,), generator=gen, device=ctx.device)


def _quiet(ctx) -> None:
    """Every rank idle and at the same point before a timed interval."""
    ctx.streams.synchronize()
    ctx.collectives.barrier()
    ctx.streams.synchronize()


def executor_for(ctx, model: Model, spec: dict, **kwargs) -> SwitchExecutor:
    """The switch executor of ``model`` with the run's transfer options (``spec['transfer']``)."""
    return SwitchExecutor(model, ctx, transfer=transfer_config(spec.get("transfer")), **kwargs)


def _say(ctx, text: str) -> None:
    if ctx.rank == 0:
        print(text, flush=True)


# ---- primitive costs ------------------------------------------------------------------------

class _Gate:
    """Keeps the current stream busy for ~``ms`` with matmuls (accelerators only), so the work the
    host queues behind it starts only once all of it is queued."""

    def __init__(self, ctx, ms: float):
        self.ctx, self.reps = ctx, 0
        if ctx.device.type == "cpu" or ms <= 0:
            return
        self.a = torch.randn(4096, 4096, device=ctx.device, dtype=torch.bfloat16)
        start, end = ctx.streams.new_event(timing=True), ctx.streams.new_event(timing=True)
        for _ in range(3):
            start.record()
            for _ in range(10):
                self.a @ self.a
            end.record()
            end.synchronize()
        self.reps = max(1, int(ms / (start.elapsed_time(end) / 10)))

    def hold(self, io=None) -> None:
        """Queue the matmuls, then (given the transfer context ``io``) a one-element all-reduce on
        its side communicator, so every rank leaves the gate together: what is timed after it
        excludes the ranks' skew at the gate's end."""
        for _ in range(self.reps):
            self.a @ self.a
        if io is not None:
            io.collectives.all_reduce(torch.zeros(1, device=io.device))


def _mover(executor: SwitchExecutor, state: State):
    return next(m for m in executor.movers if state in m.states)


def _transfer_once(ctx, executor, pos: int, dst: Layout, batch: StepBatch, state: State, gate: _Gate):
    """(device ms, host ms, transfer) of one layer's ``state`` (with indexer keys alongside KV),
    then rolled back."""
    model, io, streams = executor.model, executor.io, ctx.streams
    layer = model.layers[pos]
    lp = layer_plans(executor.plans(dst, batch))[layer.index]
    states = [s for s in (state, State.INDEXER) if s in lp.states and (s is state or state is State.KV)]
    mover = _mover(executor, state)
    _quiet(ctx)
    e0, e1 = streams.new_event(timing=True), streams.new_event(timing=True)
    t0 = time.perf_counter()
    with streams.use_stream(io.side_stream):
        gate.hold(io)
        e0.record(io.side_stream)
        t = mover.start(layer, {s: lp.states[s] for s in states}, dst, io)
        mover.finish(t, io)
        e1.record(io.side_stream)
    e1.synchronize()
    host_ms = (time.perf_counter() - t0) * 1e3
    mover.rollback(t)
    return e0.elapsed_time(e1), host_ms, t


def _bare_gather_buffers(io, per_rank: int, layer: int, state: State) -> tuple[torch.Tensor, torch.Tensor]:
    """(send, out) bytes of an all-gather of ``per_rank`` bytes per rank in the pages mover's
    memory: in place in a transfer buffer where the side collectives have them."""
    out = io.gather_buffer(("bare", state), (io.T * per_rank,), torch.uint8, layer=layer, state=state)
    if out is not None:
        return io.own_slot(out), out
    return (torch.empty(per_rank, dtype=torch.uint8, device=io.device),
            torch.empty(io.T * per_rank, dtype=torch.uint8, device=io.device))


def _bare_once(ctx, executor, t, state: State, plan, gate: _Gate) -> float:
    """A bare collective moving what ``t`` moved for ``state`` (same splits; an all-gather padded
    to the same width), timed as :func:`_transfer_once` times the mover: behind the same gate."""
    io, streams = executor.io, ctx.streams
    if state is State.WEIGHTS:
        per_rank = t.received_bytes[state] // (io.T - 1)  # in ordinary memory, as the weights mover gathers
        send = torch.empty(per_rank, dtype=torch.uint8, device=ctx.device)
        out = torch.empty(io.T * per_rank, dtype=torch.uint8, device=ctx.device)
        issue = lambda: io.collectives.all_gather_into(out, send, async_op=True)  # noqa: E731
    else:
        cache = t.layer.kv.kv
        page = cache[0].numel() * cache.element_size()
        blocks = plan.rank(io.rank)
        if plan.primitive is Primitive.ALL_GATHER:
            send, out = _bare_gather_buffers(io, int(plan.diff.recv[0].max()) * page, t.layer.index, state)
            issue = lambda: io.collectives.all_gather_into(out, send, async_op=True)  # noqa: E731
        else:
            send = torch.empty(int(blocks.send_splits.sum()) * page, dtype=torch.uint8, device=ctx.device)
            out = torch.empty(int(blocks.recv_splits.sum()) * page, dtype=torch.uint8, device=ctx.device)
            issue = lambda: io.collectives.all_to_all(out, send, (blocks.recv_splits * page).tolist(),  # noqa: E731
                                                      (blocks.send_splits * page).tolist(), async_op=True)
    _quiet(ctx)
    e0, e1 = streams.new_event(timing=True), streams.new_event(timing=True)
    with streams.use_stream(io.side_stream):
        gate.hold(io)
        e0.record(io.side_stream)
        issue().wait()
        e1.record(io.side_stream)
    e1.synchronize()
    return e0.elapsed_time(e1)


def primitive_costs(ctx, spec: dict) -> dict:
    """Per-layer primitive costs at ``spec['context']`` and per-layer step times at each of
    ``spec['calibrate']`` contexts (model of ``spec['layers']`` layers, B = ``spec['batch']``)."""
    T, rows = ctx.world_size, spec["rows"]
    contexts = sorted({spec["context"], *spec["calibrate"]})
    model = build(ctx, spec, spec["layers"], max(contexts))
    executor = executor_for(ctx, model, spec)
    batch = synthetic_batch(spec["batch"], spec["context"], rows, T, spec["page_size"])
    fill(model, batch)
    tokens = _tokens(ctx, model, batch)
    for layout in LAYOUTS:  # warm every kernel and both communicators
        executor.switch(batch, layout)
        model.step(batch, tokens)
    gate = _Gate(ctx, spec["gate_ms"])
    samples, skipped = [], []
    for src in LAYOUTS:
        executor.switch(batch, src)
        for dst in LAYOUTS:
            if dst is src:
                continue
            lp = layer_plans(executor.plans(dst, batch))[model.layers[0].index]
            for state in NETWORK_STATES:
                primitive = lp.states[state].primitive
                network = primitive is not Primitive.DISCARD
                for i in range(spec["warmup"] + spec["samples"]):
                    if past_deadline(ctx, spec["deadline"]):
                        skipped.append(f"{state}/{src}->{dst}")
                        break
                    device_ms, host_ms, t = _transfer_once(ctx, executor, 0, dst, batch, state,
                                                           gate if network else _Gate(ctx, 0))
                    bare_ms = _bare_once(ctx, executor, t, state, lp.states[state], gate) if network else 0.0
                    if i >= spec["warmup"]:
                        samples.append({"state": str(state), "src": str(src), "dst": str(dst),
                                        "primitive": str(primitive), "per_layer_ms": device_ms if network else 0.0,
                                        "device_ms": device_ms, "host_ms": host_ms, "bare_ms": bare_ms,
                                        "bytes": int(t.received_bytes.get(state, 0)), "run": i - spec["warmup"]})
        _say(ctx, f"primitives from {src}: {len(samples)} samples")
    steps = _layer_step_times(ctx, model, executor, spec, contexts)
    pulls = executor.io.peers is not None
    del executor, model
    release_cached_memory(ctx)
    return {"samples": samples, "skipped": skipped, "steps": steps, "pulls": pulls}


def _layer_step_times(ctx, model, executor, spec, contexts) -> list[dict]:
    """Per layout and context: one layer's compute (attention + MLP, between the step's
    ``before_layer`` hooks of layers 0 and 1) and the rest of the step (embedding, LM head,
    bookkeeping), p50 of 3 ready steps, for sizing the overhead table."""
    out = []
    streams = ctx.streams
    for context in contexts:
        batch = synthetic_batch(spec["batch"], context, spec["rows"], ctx.world_size, spec["page_size"])
        fill(model, batch)
        tokens = _tokens(ctx, model, batch)
        for layout in LAYOUTS:
            executor.switch(batch, layout)
            layer_ms, step_ms = [], []
            for _ in range(3):
                events = [streams.new_event(timing=True) for _ in range(len(model.layers) + 2)]

                def mark(i, events=events):
                    events[i + 1].record()

                _quiet(ctx)
                events[0].record()
                model.step(batch, tokens, before_layer=mark)
                events[-1].record()
                events[-1].synchronize()
                layer_ms.append(events[1].elapsed_time(events[2]))
                step_ms.append(events[0].elapsed_time(events[-1]))
            layer, step = float(np.median(layer_ms)), float(np.median(step_ms))
            out.append({"context": context, "layout": str(layout), "layer_ms": layer, "step_ms": step,
                        "fixed_ms": max(0.0, step - len(model.layers) * layer), "layers": len(model.layers)})
    return out


# ---- the overhead table ---------------------------------------------------------------------

def switch_overhead(ctx, spec: dict) -> dict:
    """Matched runs of every direction at ``spec['context']`` with ``spec['layers']`` layers."""
    T = ctx.world_size
    model = build(ctx, spec, spec["layers"], spec["context"])
    probe = LayerProbe(ctx.streams)
    executor = executor_for(ctx, model, spec, tracer=probe)
    batch = synthetic_batch(spec["batch"], spec["context"], spec["rows"], T, spec["page_size"])
    fill(model, batch)
    tokens = _tokens(ctx, model, batch)
    pairs = [(a, b) for i, a in enumerate(LAYOUTS) for b in LAYOUTS[i + 1:]]
    samples, skipped, plan_ms, exposed, parts = [], [], {}, [], []
    for a, b in pairs:
        executor.switch(batch, a)
        done = 0
        for run in range(spec["warmup"] + spec["runs"]):
            if past_deadline(ctx, spec["deadline"]):
                skipped.append(f"{a}<->{b} after {done} runs")
                break
            times = {}
            order = list(Mode) if run % 2 == 0 else [Mode.BLOCKING, Mode.SPLASH, Mode.READY]
            for mode in order:
                for src, dst in ((a, b), (b, a)):
                    _quiet(ctx)
                    probe.take()  # the untimed switches since the last step
                    _, report = executor.step(batch, tokens, dst, mode)
                    times[(src, dst, mode)] = report.step_ms
                    (probed,) = probe.take()
                    if mode is not Mode.BLOCKING:
                        parts.append({"src": str(src), "dst": str(dst), "mode": str(mode), "run": run,
                                      **step_parts(report.step_ms, probed, _after_last_ms(report))})
                    key = f"{src}->{dst}"  # the warm-up run plans; timed runs reuse the plan
                    plan_ms[key] = max(plan_ms.get(key, 0.0), report.plan_ms)
                    if mode is Mode.SPLASH:
                        exposed.append({"src": str(src), "dst": str(dst), "exposed_ms": report.exposed_ms,
                                        "first_layer_wait_ms": next((r.wait_ms for r in report.layers
                                                                     if r.index != report.deferred_layer), 0.0),
                                        "host_ms": report.host_ms, "run": run,
                                        "pulled_layers": sum("pull" in r.primitives.values() for r in report.layers)})
            if run >= spec["warmup"]:
                done += 1
                for src, dst in ((a, b), (b, a)):
                    samples.append({"src": str(src), "dst": str(dst), "run": run - spec["warmup"],
                                    "ready_ms": times[(src, dst, Mode.READY)],
                                    "blocking_ms": times[(src, dst, Mode.BLOCKING)],
                                    "splash_ms": times[(src, dst, Mode.SPLASH)]})
        _say(ctx, f"overhead {a}<->{b}: {done} runs")
    pulls = executor.io.peers is not None
    del executor, model
    release_cached_memory(ctx)
    return {"samples": samples, "skipped": skipped, "plan_ms": plan_ms, "exposed": exposed, "parts": parts,
            "pulls": pulls}


def step_parts(step_ms: float, probed, after_last_ms: float = 0.0) -> dict[str, float]:
    """A step's time in five parts (ms) that add up to it: before the first layer (a switch's
    checks; the step's reservations and embedding), the first layer's wait for its state, the
    later layers' waits, computing (every layer, LM head included), and the wait after the last
    layer for a layer that moves after the step (``after_last_ms``)."""
    layers = probed.layers()
    before = step_ms - probed.span_ms() - after_last_ms
    return {"before_first_ms": before, "first_wait_ms": layers["wait_ms"][0],
            "later_waits_ms": float(sum(layers["wait_ms"][1:])), "compute_ms": float(sum(layers["compute_ms"])),
            "after_last_ms": after_last_ms}


def _after_last_ms(report) -> float:
    """How long the step waited after its last layer for the layer that moves after it."""
    return next((r.wait_ms for r in report.layers if r.index == report.deferred_layer), 0.0)
