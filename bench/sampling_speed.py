"""How long choosing one step's sampled tokens takes: every row at once on the logits' device
(``splash_core.runtime.sampling.apply_draws``, what every rank runs after a step), against the
same choice made row by row on the host CPU, each row's logits copied over (where rank 0 chose
them until stop 32; then every row sorted its whole vocabulary: ``h200/sampling_speed-sorted.json``
is this benchmark at that algorithm, commit 57f019e).

Rows of random logits over DeepSeek-V3's vocabulary (129,280), per batch (``--rows``) and
sampling setting (temperature 1; temperature 0.7 with top_p 0.95; temperature 1 with top_k 50),
wall time per call after one warm-up, the device synchronised at both ends. Writes
``<out>/<platform>/sampling_speed.json``::

    python bench/sampling_speed.py                      # the device if there is one, else the CPU
    python bench/sampling_speed.py --rows 1,16 --reps 2 --no-host --out /tmp/r
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # an uninstalled checkout

import torch  # noqa: E402

from splash_core import results  # noqa: E402
from splash_core.engine.draws import uniform  # noqa: E402
from splash_core.results.stats import percentile  # noqa: E402
from splash_core.runtime.sampling import RowDraw, SamplingParams, apply_draws, choose  # noqa: E402

SETTINGS = {"temperature 1": SamplingParams(temperature=1.0, seed=1),
            "temperature 0.7, top_p 0.95": SamplingParams(temperature=0.7, top_p=0.95, seed=1),
            "temperature 1, top_k 50": SamplingParams(temperature=1.0, top_k=50, seed=1)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,16,64,256", help="rows (sampled requests) per step, comma-separated")
    p.add_argument("--vocab", type=int, default=129280)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--host-max-rows", type=int, default=64, help="time the host path up to this many rows")
    p.add_argument("--no-host", action="store_true", help="time the device path only")
    p.add_argument("--platform", default=None, help="results folder (default: h200 with CUDA, else cpu)")
    p.add_argument("--out", default="bench/results")
    return p.parse_args(argv)


def _timed(fn, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e6


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator(device="cpu").manual_seed(0)
    samples, agree = [], True
    for rows in (int(r) for r in args.rows.split(",")):
        logits = (torch.randn(rows, args.vocab, generator=g) * 3).to(device)
        for name, p in SETTINGS.items():
            draws = [RowDraw(r, p, uniform(p, r, 0)) for r in range(rows)]
            paths = {"device": lambda: apply_draws(logits.argmax(-1), logits, draws).tolist()}
            if not args.no_host and rows <= args.host_max_rows:
                paths["host, row by row"] = lambda: [choose(logits[r].cpu(), p, uniform(p, r, 0)) for r in range(rows)]
            for path, fn in paths.items():
                fn()  # warm-up (and the tokens to compare)
                for rep in range(args.reps):
                    samples.append({"case": f"{path}: {rows} rows, {name}", "us": _timed(fn, device), "rep": rep})
            if len(paths) > 1:
                agree &= paths["device"]() == paths["host, row by row"]()
    cases = []
    for case in dict.fromkeys(s["case"] for s in samples):
        us = [s["us"] for s in samples if s["case"] == case]
        cases.append({"case": case, "p50_us": percentile(us, 50), "p95_us": percentile(us, 95), "runs": len(us)})
        print(f"{case}: p50 {cases[-1]['p50_us'] / 1e3:.2f} ms")
    platform = args.platform or ("h200" if device.type == "cuda" else "cpu")
    data = results.make_result(
        benchmark="sampling_speed", platform=platform, backend="none", model=f"vocabulary {args.vocab:,}", T=1,
        dtype="fp32", samples=samples, summary={"cases": cases},
        notes=f"wall time per call on {device.type}, logits float32 on the device, the choice in float64; "
              f"device and host chose the same tokens: {'yes' if agree else 'NO'}")
    print(results.write_result(data, args.out))
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
