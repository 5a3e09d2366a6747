"""Rank-side work of ``bench/switch_host_profile.py``: where a switching step spends host time.

The workload is the switch benchmark's (:mod:`.switch`): B requests with ``context`` tokens each
in one chunked-prefill step, every layer switching, with the page counts of a real deployment
(B = 16 at 32K tokens and page 64 is 8192 pages per layer) but tiny widths, so data movement is
small and what remains is the executor's host work. On CPU every piece of a step is host work;
the timers below split a SPLASH step's switch work into

- ``prepare_ms``: the executor's ``prepare`` span (plan lookup, Eq 5 and pool checks);
- ``start_ms`` / ``land_ms``: its per-layer ``start`` and ``land`` spans
  (allocation, index tensors, packing and issuing collectives; waiting, unpacking, switching
  the layout and retiring the source copy);
- ``issue_ms``, ``wait_ms``, ``pack_ms``, ``unpack_ms``, ``pull_ms``: the parts of those that
  move data (issuing collectives, which gloo partly does on the calling thread, waiting for
  them, the page pack/unpack kernels, the pulls of pages out of peers' pools, which on the host
  are the copies themselves), so ``bookkeeping_ms`` = prepare + start + land − issue − wait −
  pack − unpack − pull is the executor's own host work.

Buckets are CPU time of the rank's main thread (``time.thread_time``), taken by a
:class:`~splash_core.runtime.switch.tracing.SwitchTracer` the executor calls at those spans:
the ranks and gloo's threads share the host's cores, so a wall clock would also count waiting
for a core.

``splash_ms − ready_ms`` is the overhead as the GPU benchmark reports it (its p50 over runs).
The same buckets are also taken (``warm_*``) for the same switch made by
:meth:`SwitchExecutor.switch`, layer after layer with no computation in between: on CPU the
step's attention runs on the host and evicts the executor's data from the caches between
layers, which inflates the in-step numbers several times over a host whose model runs on an
accelerator; the warm numbers bound them from below.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import time

from splash_core.layouts import LAYOUTS, Layout
from splash_core.runtime.switch import Mode
from splash_core.runtime.switch.tracing import SwitchTracer

from . import switch as bench

BUCKETS = ("prepare_ms", "start_ms", "land_ms", "issue_ms", "wait_ms", "pack_ms", "unpack_ms", "pull_ms")
OUTER = ("prepare", "start", "land")  # the executor's own calls (not the model's computation)


class _Timers(SwitchTracer):
    """Accumulated CPU time of this thread per bucket (span ``name`` -> ``name_ms``); while
    ``profiler`` is set, it runs inside the outermost spans."""

    def __init__(self):
        self.ms = dict.fromkeys(BUCKETS, 0.0)
        self.profiler: cProfile.Profile | None = None

    @contextlib.contextmanager
    def span(self, name: str):
        profiler = self.profiler if name in OUTER else None
        if profiler is not None:
            profiler.enable()
        t0 = time.thread_time()
        try:
            yield
        finally:
            self.ms[f"{name}_ms"] += (time.thread_time() - t0) * 1e3
            if profiler is not None:
                profiler.disable()

    def take(self) -> dict[str, float]:
        out, self.ms = self.ms, dict.fromkeys(BUCKETS, 0.0)
        out["bookkeeping_ms"] = (out["prepare_ms"] + out["start_ms"] + out["land_ms"] - out["issue_ms"]
                                 - out["wait_ms"] - out["pack_ms"] - out["unpack_ms"] - out["pull_ms"])
        return out


def _profile_text(profiler: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def host_profile(ctx, spec: dict) -> dict:
    """Matched ready / SPLASH steps of each direction in ``spec['directions']`` (or all 12),
    ``spec['runs']`` each after one warm-up (which plans), with the SPLASH step's host buckets and
    those of the same switch outside a step (``warm_*``);
    then, on every rank, the executor's calls in one SPLASH step of ``spec['profile_direction']``
    under cProfile."""
    model = bench.build(ctx, spec, spec["layers"], spec["context"])
    timers = _Timers()
    executor = bench.executor_for(ctx, model, spec, tracer=timers)
    batch = bench.synthetic_batch(spec["batch"], spec["context"], spec["rows"], ctx.world_size, spec["page_size"])
    bench.fill(model, batch)
    tokens = bench._tokens(ctx, model, batch)
    executor.switch(batch, model.layers[0].layout)  # creates the side communicator
    directions = [(Layout(a), Layout(b)) for a, b in spec["directions"]] if spec.get("directions") else \
        [(a, b) for a in LAYOUTS for b in LAYOUTS if a is not b]
    samples = []
    for src, dst in directions:
        for run in range(1 + spec["runs"]):
            executor.switch(batch, src)
            bench._quiet(ctx)
            _, ready = executor.step(batch, tokens, dst, Mode.READY)
            executor.switch(batch, src)
            bench._quiet(ctx)
            timers.take()
            _, splash = executor.step(batch, tokens, dst, Mode.SPLASH)
            in_step = timers.take()
            executor.switch(batch, src)
            bench._quiet(ctx)
            timers.take()
            executor.switch(batch, dst)  # the same work with no computation between layers
            warm = timers.take()
            if run:  # the first run plans the manifests
                samples.append({"src": str(src), "dst": str(dst), "run": run - 1, "ready_ms": ready.step_ms,
                                "splash_ms": splash.step_ms, "plan_ms": splash.plan_ms, **in_step,
                                **{f"warm_{k}": v for k, v in warm.items()}})
    src, dst = (Layout(x) for x in spec["profile_direction"])
    executor.switch(batch, src)
    executor.step(batch, tokens, dst, Mode.SPLASH)  # plans, outside the profile
    executor.switch(batch, src)
    bench._quiet(ctx)
    timers.profiler = profiler = cProfile.Profile()
    executor.step(batch, tokens, dst, Mode.SPLASH)
    timers.profiler = None
    return {"samples": samples, "profile": _profile_text(profiler, spec.get("profile_top", 30)),
            "pages_per_layer": int(model.paged_layers[0].kv.num_pages), "kv_pulls": executor.io.peers is not None}
