"""Rank-side work of ``bench/switch_host_profile.py``: where a switching step spends host time.

The workload is the switch benchmark's (:mod:`.bench`): B requests with ``context`` tokens each
in one chunked-prefill step, every layer switching, with the page counts of a real deployment
(B = 16 at 32K tokens and page 64 is 8192 pages per layer) but tiny widths, so data movement is
small and what remains is the executor's host work. On CPU every piece of a step is host work;
the timers below split a SPLASH step's switch work into

- ``prepare_ms``: :meth:`SwitchExecutor._prepare` (plan lookup, Eq 5 and pool checks);
- ``start_ms`` / ``land_ms``: the per-layer calls from the step's ``before_layer`` hook
  (allocation, index tensors, packing and issuing collectives; waiting, unpacking, switching
  the layout and retiring the source copy);
- ``issue_ms``, ``wait_ms``, ``pack_ms``, ``unpack_ms``, ``pull_ms``: the parts of those that
  move data (issuing collectives, which gloo partly does on the calling thread, waiting for
  them, the page pack/unpack kernels, the pulls of pages out of peers' pools, which on the host
  are the copies themselves), so ``bookkeeping_ms`` = prepare + start + land − issue − wait −
  pack − unpack − pull is the executor's own host work.

Buckets are CPU time of the rank's main thread (``time.thread_time``): the ranks and gloo's
threads share the host's cores, so a wall clock would also count waiting for a core.

``splash_ms − ready_ms`` is the overhead as the GPU benchmark reports it (its p50 over runs).
The same buckets are also taken (``warm_*``) for the same switch made by
:meth:`SwitchExecutor.switch`, layer after layer with no computation in between: on CPU the
step's attention runs on the host and evicts the executor's data from the caches between
layers, which inflates the in-step numbers several times over a host whose model runs on an
accelerator; the warm numbers bound them from below.
"""

from __future__ import annotations

import cProfile
import dataclasses
import io
import pstats
import time

from ...layouts import LAYOUTS, Layout
from . import bench
from .executor import SwitchExecutor
from .modes import Mode

BUCKETS = ("prepare_ms", "start_ms", "land_ms", "issue_ms", "wait_ms", "pack_ms", "unpack_ms", "pull_ms")


class _Timers:
    """Accumulated CPU time of this thread per bucket, filled by wrappers around the executor's
    methods; while ``profiler`` is set, it runs inside the outermost ones (the executor's own
    calls, not the model's computation)."""

    def __init__(self):
        self.ms = dict.fromkeys(BUCKETS, 0.0)
        self.profiler: cProfile.Profile | None = None

    def wrap(self, bucket: str, fn, outer: bool = False):
        def timed(*args, **kwargs):
            profiler = self.profiler if outer else None
            if profiler is not None:
                profiler.enable()
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ms[bucket] += (time.thread_time() - t0) * 1e3
                if profiler is not None:
                    profiler.disable()
        return timed

    def take(self) -> dict[str, float]:
        out, self.ms = self.ms, dict.fromkeys(BUCKETS, 0.0)
        out["bookkeeping_ms"] = (out["prepare_ms"] + out["start_ms"] + out["land_ms"] - out["issue_ms"]
                                 - out["wait_ms"] - out["pack_ms"] - out["unpack_ms"] - out["pull_ms"])
        return out


def _instrument(executor: SwitchExecutor, timers: _Timers) -> None:
    """Shadow the executor's per-layer methods, its transfer waits and pulls and the pack/unpack
    kernels with timed wrappers (instance attributes; the classes are untouched)."""
    for name, bucket in (("_prepare", "prepare_ms"), ("_start", "start_ms"), ("_land", "land_ms")):
        setattr(executor, name, timers.wrap(bucket, getattr(executor, name), outer=True))
    io_ = executor.io
    io_.wait = timers.wrap("wait_ms", io_.wait)
    io_._issue = timers.wrap("issue_ms", io_._issue)
    io_.pull = timers.wrap("pull_ms", io_.pull)
    k = io_.kernels
    io_.kernels = dataclasses.replace(k, pack=timers.wrap("pack_ms", k.pack), unpack=timers.wrap("unpack_ms", k.unpack))


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
    executor = SwitchExecutor(model, ctx)
    batch = bench.synthetic_batch(spec["batch"], spec["context"], spec["rows"], ctx.world_size, spec["page_size"])
    bench.fill(model, batch)
    tokens = bench._tokens(ctx, model, batch)
    timers = _Timers()
    executor.switch(batch, model.layers[0].layout)  # creates the side communicator
    _instrument(executor, timers)
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
