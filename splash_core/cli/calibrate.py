"""``splash calibrate``: measure θ on this machine and write a hardware profile.

Besides the microbenchmarks (matmul, weight and KV reads, prefill attention, collectives),
calibration times the runtime itself unless ``--no-runtime``: decode steps and prefill chunks of
a few layers of a model in every layout (:mod:`splash_core.studies.calibrate_runtime`), which give the
cost model's host term — t0 (``step_overhead_us``), the host time per layer of each layout on
eagerly run steps (``layer_overhead_us``) and how much of it hides behind device work
(``host_overlap``) — and, where decode steps replay captured graphs (``--graphs``, as the
runtime serves them), the replayed steps' own t0 and time per layer
(``graph_step_overhead_us``, ``graph_layer_overhead_us``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..platform.backend import get_backend
from ..profiles import loader
from ..results import machine_description
from .args import UsageError, at_least, writable_file
from .output import print_json, table

DTYPES = ("bf16", "fp16", "fp32")
# runtime.step_timing.GRAPH_MODES, spelled here so that building the parser imports no torch
# (tests/test_cli_package_startup.py holds the two equal)
GRAPH_MODES = ("auto", "on", "off")
UNITS = {"memory_gib": "GiB", "matmul_tflops": "TFLOP/s", "attention_tflops": "TFLOP/s",
         "decode_attention_tflops": "TFLOP/s", "host_overlap": "fraction"}


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure θ (matmul, attention, memory and collective rates, the runtime's "
                                         "host overheads and replayed steps) into a hardware profile")
    p.add_argument("--backend", default="auto", help="backend to calibrate (default: auto)")
    p.add_argument("--out", required=True, type=writable_file,
                   help="hardware profile YAML to write (a new file unless --force)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists (e.g. a committed measured profile)")
    p.add_argument("--ranks", type=at_least(1), default=None,
                   help="ranks to spawn on this host (default 1; under torchrun its group is used)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    p.add_argument("--base", default=None,
                   help="profile whose unmeasured entries are kept (default: the backend's own profile)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="compute dtype (default: bf16 on accelerators, fp32 on the host)")
    p.add_argument("--runtime", action=argparse.BooleanOptionalAction, default=True,
                   help="time runtime decode steps per layout and fit the host overheads (default: on)")
    p.add_argument("--graphs", choices=GRAPH_MODES, default="auto",
                   help="decode steps replay captured graphs: auto (where the backend captures them, as the runtime "
                        "serves), on (the backend must), off (eager, as before issue 22); prefill runs eagerly")
    p.add_argument("--model", default=None,
                   help="model profile the runtime timing builds (default: deepseek-v3 on accelerators, tiny-mla on the host)")
    p.add_argument("--layers", type=at_least(1), default=None,
                   help="layers of that model to time (default: 4 on accelerators, 3 on the host)")
    p.add_argument("--name", default=None, help="profile name (default: the file name)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _command(args, ranks: int, dtype: str, spec) -> str:
    parts = ["splash calibrate", f"--backend {args.backend}", f"--ranks {ranks}", f"--dtype {dtype}"]
    parts += ["--quick"] if args.quick else []
    parts += [f"--base {args.base}"] if args.base else []
    parts += [f"--model {spec.model} --layers {spec.layers} --graphs {spec.graphs}"] if spec else ["--no-runtime"]
    return " ".join(parts + [f"--out {args.out}"])


def _runtime_spec(args, accelerator: bool):
    from ..studies import calibrate_runtime

    if not args.runtime:
        if args.model or args.layers is not None or args.graphs != "auto":
            raise UsageError("--model, --layers and --graphs choose what the runtime timing builds; drop --no-runtime")
        return None
    if args.graphs == "on" and not accelerator:
        raise UsageError(f"--graphs on: backend {args.backend} runs on the host, which captures no graphs; "
                         f"use --graphs auto or off")
    try:
        return calibrate_runtime.RuntimeSpec.choose(accelerator, args.quick, args.model, args.layers, args.graphs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run(args) -> int:
    from ..dtypes import torch_dtype
    from ..runtime import group
    from ..runtime.spawn import RankPool
    from ..studies import calibrate, calibrate_runtime

    _check_out(args.out, args.force)
    backend = get_backend(args.backend)
    dtype = args.dtype or ("bf16" if backend.info.accelerator else "fp32")
    options = {"quick": args.quick, "dtype": torch_dtype(dtype)}
    spec = _runtime_spec(args, backend.info.accelerator)  # fail before measuring
    base_ref = args.base or backend.hardware_profile()
    base = loader.load("hardware", base_ref) if base_ref else None
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    ranks = int(os.environ["WORLD_SIZE"]) if under_torchrun else (args.ranks or 1)
    print(f"calibrating backend {backend.name} on {ranks} rank(s) in {dtype}...", file=sys.stderr)
    steps = None
    if under_torchrun:
        ctx = group.from_env(backend.name)
        theta = calibrate.calibrate_rank(ctx, options)
        if spec:
            steps = calibrate_runtime.time_steps(ctx, spec, dtype)
        rank = ctx.rank
        group.shutdown(ctx)
        if rank != 0:
            return 0
    else:
        with RankPool(ranks, backend=backend.name, timeout_s=600) as pool:
            theta = pool.run(calibrate.calibrate_rank, options)[0]
            if spec:
                print(f"timing runtime steps: {spec.describe(dtype)}...", file=sys.stderr)
                steps = pool.run(calibrate_runtime.time_steps, spec, dtype)[0]
    identity = dict(name=args.name or Path(args.out).stem, machine=machine_description(),
                    command=_command(args, ranks, dtype, spec), backend=backend.name)
    data = calibrate.build_profile(theta, base, **identity)
    if spec:  # the host term is fitted against Eq 10 under the θ just measured
        measured = loader.from_mapping("hardware", data, file=str(args.out))
        host = calibrate_runtime.fit_theta(steps, measured, spec, ranks, dtype)
        theta = {**theta, **host, "methods": {**theta.get("methods", {}), **host["methods"]}}
        data = calibrate.build_profile(theta, base, **identity)
    profile = calibrate.write_profile(data, args.out)
    if args.json:
        print_json({"out": str(args.out), "profile": data})
        return 0
    rows = [(key, q.value, _unit(key), q.label, q.ref) for key, q in profile.quantities().items()]
    print(table(rows, ["key", "value", "unit", "source", "what"], align="lrlll"))
    decode = sorted({s.path for s in profile.step_samples if s.phase == "decode" and s.layers})
    how = f" (decode steps: {', '.join(decode)})" if decode else ""
    print(f"\n{len(profile.collective_samples)} collective samples, {len(profile.step_samples)} runtime step "
          f"samples{how}; wrote {args.out}")
    return 0


def _check_out(out: str, force: bool) -> None:
    """Fail before measuring (minutes) if the profile would replace a file unasked (``--out``'s
    type has checked that it can be written)."""
    if Path(out).exists() and not force:
        raise UsageError(f"--out {out}: the file exists; write a new file, or pass --force to replace it")


def _unit(key: str) -> str:
    if key in UNITS:
        return UNITS[key]
    return "GB/s" if key.endswith("gbps") else "µs" if "_us" in key else ""
