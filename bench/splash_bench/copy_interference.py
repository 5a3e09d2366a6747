"""Rank-side work of ``bench/copy_interference.py``: the switch benchmark's step timed alone and
beside one layer's worth of page copies per layer, by copy kind (see the script)."""

from __future__ import annotations

import torch

from splash_core.layouts import State

from . import switch as bench

VARIANTS = ("alone", "kernels", "memcpy", "pull", "pull_pitched", "spin")
PULLS = ("pull", "pull_pitched")
SPINS = 8  # spin: kernels per layer


def spinner(ctx, spin_ms: float):
    """``spin()``: on the current stream, a one-thread kernel that spins about ``spin_ms`` (as a
    collective's kernel waiting for a peer holds a processor while doing nothing); on other
    devices nothing."""
    if ctx.device.type != "cuda" or spin_ms <= 0:
        return lambda: None
    streams, took = ctx.streams, []
    for _ in range(3):  # the first call loads the kernel
        start, end = streams.new_event(timing=True), streams.new_event(timing=True)
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        end.synchronize()
        took.append(start.elapsed_time(end))
    cycles = int(1_000_000 * spin_ms / max(min(took), 1e-6))
    return lambda: torch.cuda._sleep(cycles)


def pull_copies(base: int, page_bytes: int, src_first: int, dst_first: int, pages: int, per_copy: int,
                pitched: bool) -> list[tuple[int, ...]]:
    """Copies (:meth:`PeerBuffers.pull` rows) of ``pages`` pages, ``per_copy`` a copy, to
    consecutive pages from ``dst_first``: from consecutive pages from ``src_first``, or
    (``pitched``) from every other page from there, one pitched copy each (what a pull from a
    CP holder does)."""
    out = []
    for first in range(0, pages, per_copy):
        n = min(per_copy, pages - first)
        dst = base + (dst_first + first) * page_bytes
        if pitched:
            out.append((base + (src_first + 2 * first) * page_bytes, dst, page_bytes, n, 2 * page_bytes, page_bytes))
        else:
            out.append((base + (src_first + first) * page_bytes, dst, n * page_bytes, 1, n * page_bytes, n * page_bytes))
    return out


def _copier(ctx, model, nbytes: int, how: str, peers, spin=lambda: None):
    """``copy(layer)``: on the current stream, ``nbytes`` of ``layer``'s pages into other pages,
    by the pack and unpack kernels, or by one memcpy per request's run of pages (torch's, or a
    pull through ``peers``, this rank's own shared pool; ``pull_pitched``: every other page, one
    pitched copy per request); ``spin``: no copies, ``SPINS`` calls of ``spin()``."""
    layer0 = model.paged_layers[0]
    page_bytes = layer0.kv.format.kv_page_bytes
    pages = max(1, min(int(nbytes // page_bytes), layer0.kv.num_pages // 3))  # sources span 2x, apart from the last
    per_request = max(1, pages // 16)
    runs = [(i * per_request, min(per_request, pages - i * per_request)) for i in range(-(-pages // per_request))]
    src = torch.arange(pages, device=ctx.device, dtype=torch.int32)
    dst = src + layer0.kv.num_pages - pages  # the last pages: never the history's first ones
    kernels = model.kernels
    buffer = torch.empty((pages, *layer0.kv.kv.shape[1:]), dtype=layer0.kv.kv.dtype, device=ctx.device)

    def copy(layer) -> None:
        cache = layer.kv.kv
        if how == "kernels":
            kernels.unpack(cache, dst, kernels.pack(cache, src, out=buffer))
        elif how in PULLS:
            peers.pull(0, pull_copies(layer.kv.offsets[State.KV], page_bytes, 0, layer.kv.num_pages - pages, pages,
                                      per_request, how == "pull_pitched"))
        elif how == "spin":
            for _ in range(SPINS):
                spin()
        else:
            for first, n in runs:
                cache[layer.kv.num_pages - pages + first: layer.kv.num_pages - pages + first + n].copy_(
                    cache[first: first + n])

    return copy, (0 if how == "spin" else pages * page_bytes), (SPINS if how == "spin" else len(runs))


def measure(ctx, spec: dict, layers: int, context: int, sizes: list[float], runs: int, spin_ms: float = 0.25) -> dict:
    """Raw samples of every variant and size (``spin``: once, ``SPINS`` kernels of ``spin_ms``
    per layer), interleaved over ``runs``, and what ran each copy kind."""
    memory = ctx.backend.peer_memory(ctx.host_collectives(), ctx.device)  # for the pull variant, if any
    model = bench.build(ctx, spec, layers, context, peer_memory=memory)
    peers = memory.share(model.pool.buffer) if memory is not None else None
    batch = bench.synthetic_batch(spec["batch"], context, spec["rows"], 1, spec["page_size"])
    bench.fill(model, batch)
    tokens = bench._tokens(ctx, model, batch)
    streams, side = ctx.streams, ctx.streams.new_stream()

    def step(copy) -> float:
        def beside(i: int) -> None:
            if copy is None:
                return
            reached = streams.new_event()
            reached.record()
            reached.wait(side)
            with streams.use_stream(side):
                copy(model.layers[i])
            done = streams.new_event()
            done.record(side)
            done.wait()  # the step ends only once its copies did

        streams.synchronize()
        start, end = streams.new_event(timing=True), streams.new_event(timing=True)
        start.record()
        model.step(batch, tokens, before_layer=beside)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def alone(copy) -> float:
        streams.synchronize()
        start, end = streams.new_event(timing=True), streams.new_event(timing=True)
        start.record()
        copy(model.layers[0])
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    kinds = [how for how in VARIANTS[1:] if how not in PULLS or peers is not None]
    spin = spinner(ctx, spin_ms)
    copiers = {(how, mib): _copier(ctx, model, int(mib * (1 << 20)), how, peers, spin)
               for mib in sizes for how in kinds if how != "spin"} | {("spin", 0.0): _copier(ctx, model, 0, "spin", peers, spin)}
    for _ in range(2):  # warm every kernel and the allocator
        step(None)
        for copy, _, _ in copiers.values():
            step(copy)
    samples = []
    for run in range(runs):  # interleaved, so drift (clocks, heat) hits every variant alike
        samples.append({"variant": "alone", "mib": 0.0, "run": run, "step_ms": step(None), "copy_alone_ms": 0.0,
                        "bytes_per_layer": 0, "copies_per_layer": 0})
        for (how, mib), (copy, nbytes, count) in copiers.items():
            samples.append({"variant": how, "mib": mib, "run": run, "step_ms": step(copy),
                            "copy_alone_ms": alone(copy), "bytes_per_layer": int(nbytes),
                            "copies_per_layer": 2 if how == "kernels" else count})
    return {"samples": samples, "ran": _what_runs(ctx, model, copiers)}


def _what_runs(ctx, model, copiers) -> dict:
    """Per copy kind, the device activities one copy showed in the profiler (accelerators only)."""
    if ctx.device.type == "cpu":
        return {}
    out = {}
    first = next(iter(copiers))[1]
    for (how, _), (copy, _, _) in [(k, v) for k, v in copiers.items() if k[1] in (first, 0.0)]:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            copy(model.layers[0])
            torch.cuda.synchronize()
        out[how] = sorted({e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    return out


def run_lengths(ctx, spec: dict, context: int, mib: float, lengths: list[int], runs: int) -> list[dict]:
    """``mib`` of one layer's pages pulled through the backend's peer memory (the pool shared with
    itself) in runs of each of ``lengths`` pages, consecutive and (``pitched``) every other page
    in pitched copies, on an idle device: device and host time per layer, p50 over ``runs``
    (what decides the shortest run worth a pull)."""
    import time

    memory = ctx.backend.peer_memory(ctx.host_collectives(), ctx.device)
    if memory is None:
        return []
    model = bench.build(ctx, spec, 1, context, peer_memory=memory)
    peers = model.pool.memory.share(model.pool.buffer)
    layer, streams = model.paged_layers[0], ctx.streams
    page_bytes, base = layer.kv.format.kv_page_bytes, layer.kv.offsets[State.KV]
    pages = min(int(mib * (1 << 20) // page_bytes), layer.kv.num_pages // 3)
    out = []
    for pitched in (False, True):
        for length in lengths:
            copies = pull_copies(base, page_bytes, 0, layer.kv.num_pages - pages, pages, length, pitched)
            device, host = [], []
            for _ in range(runs + 1):
                streams.synchronize()
                start, end = streams.new_event(timing=True), streams.new_event(timing=True)
                start.record()
                t0 = time.perf_counter()
                peers.pull(0, copies)
                host.append((time.perf_counter() - t0) * 1e3)
                end.record()
                end.synchronize()
                device.append(start.elapsed_time(end))
            out.append({"run_pages": length, "run_bytes": length * page_bytes, "copies": len(copies),
                        "pitched": pitched, "bytes": pages * page_bytes, "device_ms": sorted(device[1:])[runs // 2],
                        "host_ms": sorted(host[1:])[runs // 2]})
    return out
