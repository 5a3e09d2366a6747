#!/usr/bin/env python
"""What the engine's start-up capture of decode graphs costs at real widths: ``splash run``'s code
path with a short workload of ``--requests`` concurrent requests (so every bucket up to it is
captured at start-up), per initial layout and layer count; the load report's graphs (captures,
host seconds, the growth of reserved device memory they caused) per run, and per (bucket graph,
layer) from the difference between two layer counts (which cancels what does not scale with
layers). And the choice issue 22 §1 asks to make by measurement: a decode run through forced
switches (``--switches``, at the larger layer count) whose switches hand layers new weight
tensors, so the next decode step captures the destination's graph again: the host seconds of
those re-captures while serving, beside what the other design (every layout's weights held in
stable buffers) would hold for good: the projection weights W_A of a second layout per rank.

On one H200::

    python bench/graph_memory.py --out $OUT

``--smoke`` runs the same code on the tiny CPU deployment (static graphs: nothing is captured).
Writes ``<out>/<platform>/graph_memory.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # uninstalled checkout

from splash_core import results  # noqa: E402
from splash_core.engine import Job, serve  # noqa: E402
from splash_core.profiles import load  # noqa: E402
from splash_core.profiles.loader import find  # noqa: E402
from splash_core.runtime.spawn import RankPool  # noqa: E402

MIB = float(1 << 20)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--deployment", default="h200-x2-deepseek-v3")
    p.add_argument("--layers", default="10,61", help="two layer counts (their difference gives the per-layer cost)")
    p.add_argument("--layouts", default="TP,DOP")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--switches", default="TP,DP,TP,DOP", help="layouts of the forced-switch run ('' skips it)")
    p.add_argument("--every", type=int, default=12, help="decode steps between its switches")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        args.deployment, args.layers, args.requests, args.every = "cpu-tiny", "2,4", 4, 3
    return args


def switched(pool, args, layers: int) -> dict:
    """Decode through the forced switches of ``--switches`` (one prefill step, then ``--every``
    steps per layout): the captures made while serving and what a switch held."""
    from splash_core.engine.policy import ScriptedPolicy
    from splash_core.layouts import Layout

    script = tuple(Layout(x) for x in args.switches.split(","))
    data = yaml.safe_load(Path(find("deployment", args.deployment)).read_text())
    data.update(name=f"{data['name']}-recapture", T=1, layers=layers, initial_layout=str(script[0]))
    out = args.every * len(script) + 2
    work = {"kind": "workload", "name": "graph-recapture", "seed": 1,
            "rollout": {"requests": 16, "prompt_tokens": [64, 256], "output_tokens": [out, out]}}
    summary = pool.run(serve, Job(data, work, policy=ScriptedPolicy(script, every=args.every), check=False))[0]
    graphs = summary.load.get("graphs", {})
    return {"layers": layers, "script": args.switches, "every": args.every,
            "switches": [{"step": w.step, "src": w.src, "dst": w.dst, "step_ms": w.step_ms, "exposed_ms": w.exposed_ms,
                          "bytes": w.bytes_total} for w in summary.done_switches],
            "while_serving": graphs.get("while_serving", {}), "start_up_captures": len(graphs.get("start_up", [])),
            "decode_step_p50_ms": sorted(summary.step_ms)[len(summary.step_ms) // 2],
            "stable_buffer_bytes": int(summary.load["memory"]["weights"]),
            "memory": summary.load["memory"]}


def run(pool, args, layout: str, layers: int):
    data = yaml.safe_load(Path(find("deployment", args.deployment)).read_text())
    data.update(name=f"{data['name']}-graphs", T=1, layers=layers, initial_layout=layout)
    work = {"kind": "workload", "name": "graph-start-up", "seed": 1,
            "rollout": {"requests": args.requests, "prompt_tokens": [64, 256], "output_tokens": [2, 4]}}
    summary = pool.run(serve, Job(data, work, policy=layout, check=False))[0]
    return data, summary


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.time()
    counts = [int(n) for n in args.layers.split(",")]
    samples, dep, backend = [], None, "reference"
    with RankPool(1, backend="auto", timeout_s=900) as pool:
        run(pool, args, args.layouts.split(",")[0], counts[0])  # untimed: compiles the kernels
        for layout in args.layouts.split(","):
            for layers in counts:
                data, summary = run(pool, args, layout, layers)
                graphs = summary.load.get("graphs", {})
                made = graphs.get("start_up", [])  # what start-up captured (serving may capture later)
                samples.append({"layout": layout, "layers": layers, "requests": args.requests,
                                "captures": len(made), "seconds": float(sum(c["seconds"] for c in made)),
                                "bytes": int(sum(c["bytes"] for c in made)), "buckets": graphs.get("buckets", []),
                                "line": graphs.get("line", ""), "start_up": made})
                print(samples[-1], flush=True)
                dep, backend = data, summary.backend
        recapture = switched(pool, args, counts[-1]) if args.switches else None
    if recapture is not None:
        print("re-capture:", recapture["while_serving"], f"stable buffers would hold "
              f"{recapture['stable_buffer_bytes'] / MIB:,.0f} MiB more", flush=True)
    per = {}
    for layout in args.layouts.split(","):
        (a, b) = [s for s in samples if s["layout"] == layout]
        graphs = max(b["captures"], 1)
        per[layout] = {"mib_per_graph_layer": (b["bytes"] - a["bytes"]) / MIB / graphs / (b["layers"] - a["layers"]),
                       "capture_ms_per_layer": 1e3 * (b["seconds"] - a["seconds"]) / graphs / (b["layers"] - a["layers"])}
    profile = load("deployment", dep)
    data = results.make_result(
        benchmark="graph_memory", platform=profile.hardware.platform, backend=backend, model=profile.model.name, T=1,
        dtype=profile.compute_dtype, samples=samples, summary={"per_layout": per, "recapture": recapture},
        notes=("start-up capture of every bucket up to the run's concurrency; bytes = growth of reserved device "
               "memory while capturing (the backend's graph ops); per graph and layer from two layer counts; "
               "recapture: 16 requests decoding through forced switches, the captures made while serving (host "
               "seconds, why) and stable_buffer_bytes = this rank's projection weights W_A, what holding a second "
               "layout's copy in stable buffers would add for good"))
    print(per, "\nwrote", results.write_result(data, args.out), f"({time.time() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
