"""``splash calibrate``: measure θ on this machine and write a hardware profile."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .. import calibrate
from ..backend import get_backend
from ..profiles import loader
from ..results import machine_description
from .main import UsageError
from .output import print_json, table

DTYPES = ("bf16", "fp16", "fp32")
UNITS = {"memory_gib": "GiB", "matmul_tflops": "TFLOP/s", "collective_latency_us": "µs"}


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure θ (matmul, memory and collective rates) into a hardware profile")
    p.add_argument("--backend", default="auto", help="backend to calibrate (default: auto)")
    p.add_argument("--out", required=True, help="hardware profile YAML to write")
    p.add_argument("--ranks", type=int, default=None,
                   help="ranks to spawn on this host (default 1; under torchrun its group is used)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    p.add_argument("--base", default=None,
                   help="profile whose unmeasured entries are kept (default: the backend's own profile)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="compute dtype (default: bf16 on accelerators, fp32 on the host)")
    p.add_argument("--name", default=None, help="profile name (default: the file name)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _command(args, ranks: int, dtype: str) -> str:
    parts = ["splash calibrate", f"--backend {args.backend}", f"--ranks {ranks}", f"--dtype {dtype}"]
    parts += ["--quick"] if args.quick else []
    parts += [f"--base {args.base}"] if args.base else []
    return " ".join(parts + [f"--out {args.out}"])


def run(args) -> int:
    from ..dtypes import torch_dtype
    from ..runtime import group
    from ..runtime.spawn import RankPool

    if args.ranks is not None and args.ranks < 1:
        raise UsageError(f"--ranks must be >= 1 (got {args.ranks})")
    backend = get_backend(args.backend)
    dtype = args.dtype or ("bf16" if backend.info.accelerator else "fp32")
    options = {"quick": args.quick, "dtype": torch_dtype(dtype)}
    base_ref = args.base or backend.hardware_profile()
    base = loader.load("hardware", base_ref) if base_ref else None  # fail before measuring
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    ranks = int(os.environ["WORLD_SIZE"]) if under_torchrun else (args.ranks or 1)
    print(f"calibrating backend {backend.name} on {ranks} rank(s) in {dtype}...", file=sys.stderr)
    if under_torchrun:
        ctx = group.from_env(backend.name)
        theta = calibrate.calibrate_rank(ctx, options)
        rank = ctx.rank
        group.shutdown(ctx)
        if rank != 0:
            return 0
    else:
        with RankPool(ranks, backend=backend.name, timeout_s=600) as pool:
            theta = pool.run(calibrate.calibrate_rank, options)[0]
    data = calibrate.build_profile(theta, base, name=args.name or Path(args.out).stem,
                                   machine=machine_description(), command=_command(args, ranks, dtype),
                                   backend=backend.name)
    profile = calibrate.write_profile(data, args.out)
    if args.json:
        print_json({"out": str(args.out), "profile": data})
        return 0
    rows = [(key, q.value, UNITS.get(key, "GB/s" if key.endswith("gbps") else ""), q.label, q.ref)
            for key, q in profile.quantities().items()]
    print(table(rows, ["key", "value", "unit", "source", "what"], align="lrlll"))
    print(f"\n{len(profile.collective_samples)} collective samples; wrote {args.out}")
    return 0
