"""Rank-side work of ``bench/precopy_step.py``: a pre-copy step against an ordinary step.

The workload is the switch benchmark's (:mod:`.switch`): B requests with ``context`` tokens of
history each, here in decode (``rows`` query rows per request, in the last page), with the page
counts of a real deployment but the widths of ``spec['model']``. Per direction and run, on
every rank, each step timed by the wall clock and by this thread's CPU time, every rank idle and
together before it:

- ``ordinary``: the step in the source layout;
- ``precopy``: each of the ``precopy_steps`` steps of a pre-copy to the destination (the same
  step, copying ``layers / precopy_steps`` layers' prefixes beside it); ``host_ms`` is the
  pre-copy's own host work in it (planning, the memory check, starting and landing the copies);
- ``handoff``: the switching step that hands that pre-copy off (only the dirty tails move);
- ``one_step``: the same switch in one step (SPLASH mode), for comparison.

Between runs the layers move back to the source layout outside any timed step.
"""

from __future__ import annotations

import time

from splash_core.layouts import Layout, State
from splash_core.runtime.switch import Mode

from . import switch as bench


def _timed(ctx, fn):
    """(result, wall ms, CPU ms of this thread) of ``fn()``, every rank idle and together before it."""
    bench._quiet(ctx)
    w0, c0 = time.perf_counter(), time.thread_time()
    out = fn()
    ctx.streams.synchronize()
    return out, (time.perf_counter() - w0) * 1e3, (time.thread_time() - c0) * 1e3


def precopy_steps(ctx, spec: dict) -> dict:
    """The samples of every direction in ``spec['directions']``, ``spec['runs']`` runs each after
    one warm-up run (which plans)."""
    model = bench.build(ctx, spec, spec["layers"], spec["context"])
    executor = bench.executor_for(ctx, model, spec)
    batch = bench.synthetic_batch(spec["batch"], spec["context"], spec["rows"], ctx.world_size, spec["page_size"])
    bench.fill(model, batch)
    tokens = bench._tokens(ctx, model, batch)
    executor.switch(batch, model.layers[0].layout)  # creates the side communicator
    k = spec["precopy_steps"]
    samples = []
    for src, dst in ((Layout(a), Layout(b)) for a, b in spec["directions"]):
        for run in range(1 + spec["runs"]):
            rows = []
            executor.switch(batch, src)
            _, wall, cpu = _timed(ctx, lambda: model.step(batch, tokens))
            rows.append({"kind": "ordinary", "step": 0, "wall_ms": wall, "cpu_ms": cpu})
            pc = executor.precopy(dst, batch, k)
            for i in range(k):
                (_, report), wall, cpu = _timed(ctx, lambda: pc.step(batch, tokens))
                rows.append({"kind": "precopy", "step": i, "wall_ms": wall, "cpu_ms": cpu, "host_ms": report.host_ms,
                             "layers": len(report.layers), "received_bytes": report.received_bytes,
                             "paused": report.paused})
            (_, handoff), wall, cpu = _timed(ctx, lambda: executor.step(batch, tokens, dst, Mode.SPLASH, precopy=pc))
            rows.append({"kind": "handoff", "step": 0, "wall_ms": wall, "cpu_ms": cpu,
                         "received_bytes": handoff.bytes_received.get(State.KV.value, 0)})
            executor.switch(batch, src)
            (_, one), wall, cpu = _timed(ctx, lambda: executor.step(batch, tokens, dst, Mode.SPLASH))
            rows.append({"kind": "one_step", "step": 0, "wall_ms": wall, "cpu_ms": cpu,
                         "received_bytes": one.bytes_received.get(State.KV.value, 0)})
            if run:  # the first run plans
                samples += [{"src": str(src), "dst": str(dst), "run": run - 1, **r} for r in rows]
    return {"samples": samples, "pages_per_layer": int(model.paged_layers[0].kv.num_pages)}
