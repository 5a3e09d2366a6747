#!/usr/bin/env python
"""How much a switch's page copies slow the step computing beside them, by how they copy: on one
GPU, so it runs where only one is lent (``nvidia-h200``).

One rank builds the switch benchmark's model (DeepSeek-V3 attention dims, B requests x ``--rows``
query rows over ``--context`` tokens of history, ``--layers`` layers, T = 1) and times its step
(device events, p50 over ``--runs``) in turn:

- ``alone``: the step and nothing else;
- ``kernels``: beside each layer, on a side stream, what the collective path does to a layer's
  pages on both ends of a transfer: the backend's pack kernel gathers ``--mib`` of pages into a
  buffer and its unpack kernel writes them into other pages (2 reads and 2 writes per byte
  moved, on processors);
- ``memcpy``: the same pages copied straight into the other pages, one ``cudaMemcpyAsync``
  per run of consecutive pages (a request's pages; torch's ``copy_``), as pulls out of a peer's
  pool do (1 read and 1 write per byte; on this one GPU both sides of the copy are local memory);
- ``pull``: the same runs through the backend's peer memory (the pool is allocated in it and
  shared with the group of one, so the peer is this rank itself): exactly the calls a switch's
  pulls make (on CUDA, ``cuMemcpyDtoDAsync`` through ctypes). Left out where the backend has
  no peer memory;
- ``pull_pitched``: as ``pull``, but from every other page, one pitched copy per request (rows
  of a page, two pages apart: what a pull from a CP holder makes; ``cuMemcpy2DAsync``);
- ``spin``: no copies, but 8 one-thread kernels of ``--spin-ms`` each (on CUDA): what side
  work costs that holds a processor while doing nothing, as a collective's kernel waiting for
  a peer does.

Side work starts when the compute stream reaches the layer (as the switch executor aligns a
layer's transfer), so each layer computes beside one layer's worth of copies. Each copy's time
alone is measured too (``copy_alone_ms``), and one profiled copy of each kind names what ran it
(a kernel, or a copy engine's ``Memcpy DtoD``). Then the first size's pages are pulled alone in
runs of each of ``--run-lengths`` pages, consecutive and pitched (``run_lengths``: device and
host time), for the
shortest run a pull is worth (``PeerBuffers.min_run_bytes``). Writes
``<out>/<platform>/copy_interference.json`` (command, machine, date, raw samples).
``--smoke`` runs the same code on tiny shapes on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout


from splash_bench import step as step_bench  # noqa: E402
from splash_bench.copy_interference import measure, run_lengths  # noqa: E402
from splash_core import results  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results", help="results root; files go to <out>/<platform>/")
    p.add_argument("--backend", default="auto")
    p.add_argument("--platform", default=None, help="results folder (default: the backend's hardware profile)")
    p.add_argument("--model", default="deepseek-v3")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=131072)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--mib", default="576,1152", help="MiB of pages copied beside each layer (comma-separated)")
    p.add_argument("--spin-ms", type=float, default=0.25, help="spin: each kernel's time")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--run-lengths", default="1,4,16,64,256",
                   help="pages per copy for the pulls-alone sweep (comma-separated)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks this script's logic")
    args = p.parse_args(argv)
    if args.smoke:
        args.backend, args.model, args.dtype, args.batch, args.context = "reference", "tiny-mla", "fp32", 4, 256
        args.rows, args.page_size, args.layers, args.mib, args.runs = 4, 16, 2, "0.05", 2
        args.run_lengths = "1,4"
        args.platform = args.platform or "cpu"
    args.mib = [float(m) for m in str(args.mib).split(",")]
    args.run_lengths = [int(n) for n in str(args.run_lengths).split(",")]
    return args


def _spec(args) -> dict:
    return dict(model=args.model, dtype=args.dtype, kernels="backend", batch=args.batch, page_size=args.page_size,
                rows=args.rows, seed=0, initial="TP")


def summarize(samples: list[dict], layers: int) -> list[dict]:
    base = statistics.median(s["step_ms"] for s in samples if s["variant"] == "alone")
    rows = []
    for how, mib in sorted({(s["variant"], s["mib"]) for s in samples if s["variant"] != "alone"}):
        mine = [s for s in samples if (s["variant"], s["mib"]) == (how, mib)]
        step = statistics.median(s["step_ms"] for s in mine)
        gib = mine[0]["bytes_per_layer"] * layers / (1 << 30)
        rows.append({"variant": how, "mib_per_layer": mib, "step_alone_ms": base, "step_ms": step,
                     "slowdown_ms": step - base, "slowdown_pct": (step / base - 1) * 100,
                     "slowdown_ms_per_gib": (step - base) / gib if gib else 0.0,
                     "copy_alone_ms": statistics.median(s["copy_alone_ms"] for s in mine),
                     "copies_per_layer": mine[0]["copies_per_layer"]})
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.time()
    with RankPool(1, backend=args.backend, timeout_s=600) as pool:
        info = pool.run(step_bench.describe_rank)[0]
        if args.backend == "auto" and info["device"] == "cpu" and not args.smoke:
            raise SystemExit("no accelerator backend found: pass --backend reference or --smoke to run on the CPU")
        out = pool.run(measure, _spec(args), args.layers, args.context, args.mib, args.runs, args.spin_ms)[0]
        lengths = pool.run(run_lengths, _spec(args), args.context, args.mib[0], args.run_lengths, args.runs)[0]
    rows = summarize(out["samples"], args.layers)
    platform = args.platform or ("cpu" if info["device"] == "cpu" else info["profile"] or "gpu")
    data = results.make_result(
        benchmark="copy_interference", platform=platform, backend=info["backend"], model=args.model, T=1,
        dtype=args.dtype, samples=out["samples"],
        summary={"workload": f"B={args.batch}, {args.context // 1024}K context, {args.layers} layers, prefill chunk "
                             f"of {args.rows} rows per request, T = 1", "rows": rows},
        extra={"ran": out["ran"], "run_lengths": lengths},
        notes="step_ms: device time of one step, copies beside every layer on a side stream started when the "
              "compute stream reached the layer and waited for before the step ends; kernels: the backend's "
              "pack + unpack of the pages (what the collective path does on both ends); memcpy: one "
              "cudaMemcpyAsync per request's run of pages (what a pull does), here within one GPU's memory; "
              "pull: the same runs through the backend's peer memory (the pool shared with itself); "
              "pull_pitched: every other page, one pitched copy per request's pages; "
              f"spin: no copies, 8 one-thread kernels of {args.spin_ms:g} ms each beside each layer; "
              "copy_alone_ms: one layer's copies on an idle device. p50 over interleaved runs. run_lengths: "
              "the first size's pages pulled alone in copies of run_pages pages each (pitched: every other "
              "page, rows of a page): device and host ms.")
    print("wrote", results.write_result(data, args.out), f"({time.time() - start:.0f} s)")
    print(f"{'variant':12s} {'MiB':>7s} {'step ms':>9s} {'+ms':>8s} {'+%':>6s} {'ms/GiB':>7s} {'copy ms':>8s}")
    for r in rows:
        print(f"{r['variant']:12s} {r['mib_per_layer']:7.0f} {r['step_ms']:9.2f} {r['slowdown_ms']:8.2f} "
              f"{r['slowdown_pct']:6.2f} {r['slowdown_ms_per_gib']:7.3f} {r['copy_alone_ms']:8.3f}")
    print(f"alone: {rows[0]['step_alone_ms']:.2f} ms; ran: {out['ran']}")
    print(f"{'pitched':>7s} {'run pages':>9s} {'run KiB':>8s} {'copies':>7s} {'device ms':>9s} {'GB/s':>7s} {'host ms':>8s}")
    for r in lengths:
        print(f"{str(r.get('pitched', False)):>7s} {r['run_pages']:9d} {r['run_bytes'] / 1024:8.0f} {r['copies']:7d} {r['device_ms']:9.3f} "
              f"{r['bytes'] / max(r['device_ms'], 1e-9) / 1e6:7.1f} {r['host_ms']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
