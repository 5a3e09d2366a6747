#!/usr/bin/env python
"""Expanded (MHA-form) MLA prefill attention on one GPU: Triton against torch's SDPA kernels (issues 23 §1, 39).

    python3 bench/expanded_attention.py --out OUT [--platform h100] [--buckets] [--write-providers FILE]
                                        [--block-m 128 ...]
    python3 bench/expanded_attention.py --tiny --out /tmp/x     # (or --smoke) the same logic on CPU

Times, per point, the providers of the expanded form at DeepSeek-V3 widths (d_n 128, d_r 64, d_v
128, bf16) on prefill chunks after history: ``triton`` (:func:`splash_core.kernels.triton_expanded_attention`,
its launch plan cached as across a step's layers), ``sdpa`` (:mod:`splash_core.kernels.expanded_sdpa` on
torch's cuDNN attention, requests of equal shape batched into one call), ``sdpa_per_request`` (the
same, one call per request: the variable-length alternative) and ``sdpa_efficient`` (torch's
memory-efficient kernel, batched); on CPU every SDPA variant runs torch's math algorithm. Points
(B requests x rows each, history, heads): fresh 8K chunks x B = 1, 4, 8 and one 32K prompt at 128
heads, a 2K chunk after 30K of history, smaller calls (for the provider threshold), and 16 heads
(128 over T = 8). Keys come as kv_b's output does: k_nope and v views of one [M, H, 256] tensor,
the rotary key [M, 64] shared by every head. Per point: Triton's ``do_bench`` median (L2 flushed)
and TFLOP/s = visible (query, key) pairs x 2·(d_n + d_r + d_v)·H / time, visible pairs = B·(rows·history
+ rows·(rows+1)/2) (causal: the work a kernel must do, not the dense square), and each provider's
first call on the shape (compile or cuDNN graph build); beside them the bf16 matmul rate (8192³) of
the same run. First, every provider on one small bf16 case (several requests,
rows interleaved, a CP-style request, a row that sees nothing) against the float32 reference; a wrong
provider fails the run and is never chosen. ``--write-providers FILE`` sets the ``expanded`` entry of
the hopper backend's provider table: per head count the fewest query rows from which ``sdpa`` was
faster than Triton at every larger measured point. ``--buckets`` adds ``sdpa_buckets`` (the same on
shape buckets, :mod:`splash_core.kernels.expanded_buckets`, of ``--granularity``,
``--smallest-rows`` and ``--row-step``): first its warm-up
builds every bucket shape of a deployment of ``--warm-rows`` rows a call and ``--warm-context``
keys (timed, counted: the build time a server pays once), then its points are timed like the
others (``first_call_ms`` then shows what the warm-up did not build); the provider choice and
``--write-providers`` then weigh the bucketed provider against Triton and record its buckets.
Writes ``OUT/<platform>/expanded_attention.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

SMOKE = {"--tiny", "--smoke"}
if SMOKE & set(sys.argv):  # the interpreter's flag is read when Triton kernels are defined
    os.environ["TRITON_INTERPRET"] = "1"
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

import torch  # noqa: E402
from splash_backend_hopper.providers import expanded_thresholds  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

from splash_bench import provider_table  # noqa: E402
from splash_bench.platform_name import accelerator_platform  # noqa: E402
from splash_core.kernels import ExpandedTile, triton_expanded_attention  # noqa: E402
from splash_core.kernels.expanded_buckets import BucketSizes  # noqa: E402
from splash_core.kernels.expanded_sdpa import host_plan, sdpa_expanded_attention  # noqa: E402
from splash_core.reference.expanded import expanded_attention as reference  # noqa: E402
from splash_core.results import machine_description, make_result, write_result  # noqa: E402
from splash_core.testing.mla_inputs import expanded_case, tolerance  # noqa: E402

# (B requests, rows each, history, heads)
FULL = {"heads": 128, "d_n": 128, "d_r": 64, "d_v": 128, "dtype": torch.bfloat16, "matmul": 8192,
        "points": [(1, 8192, 0, 128), (4, 8192, 0, 128), (8, 8192, 0, 128), (1, 32768, 0, 128), (1, 2048, 30720, 128),
                   (1, 8192, 8192, 128), (4, 2048, 0, 128), (4, 2048, 8192, 128), (16, 512, 8192, 128),
                   (1, 512, 0, 128), (1, 8192, 0, 16), (8, 8192, 0, 16), (1, 2048, 30720, 16)]}
# The interpreter computes bf16 dots wrongly (docs/design.md §6): the dry run uses fp16.
TINY = {"heads": 2, "d_n": 16, "d_r": 8, "d_v": 16, "dtype": torch.float16, "matmul": 128,
        "points": [(1, 32, 0, 2), (1, 32, 32, 2), (2, 16, 16, 2), (2, 16, 0, 1)],
        "buckets": BucketSizes(16, 4, 8), "warm": (64, 256)}  # replace the bucket and warm-up options
SDPA = {"cpu": {"sdpa": SDPBackend.MATH, "sdpa_per_request": SDPBackend.MATH},
        "accelerator": {"sdpa": SDPBackend.CUDNN_ATTENTION, "sdpa_per_request": SDPBackend.CUDNN_ATTENTION,
                        "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    p.add_argument("--platform", default=None, help="results folder (default: the GPU's model)")
    p.add_argument("--tiny", "--smoke", dest="tiny", action="store_true",
                   help="tiny shapes on CPU (Triton's interpreter, torch's math SDPA)")
    p.add_argument("--write-providers", metavar="FILE", help="record per head count from how many rows SDPA serves")
    p.add_argument("--buckets", action="store_true", help="also SDPA on shape buckets (sdpa_buckets), warmed up first")
    p.add_argument("--granularity", type=int, default=BucketSizes().granularity, help="bucket granularity G (keys)")
    p.add_argument("--smallest-rows", type=int, default=BucketSizes().smallest_rows, help="smallest row bucket")
    p.add_argument("--row-step", type=int, default=BucketSizes().row_step, help="row buckets' step above it")
    p.add_argument("--warm-rows", type=int, default=8192, help="warm-up: most query rows of a call (prefill chunk)")
    p.add_argument("--warm-context", type=int, default=32768, help="warm-up: most keys of a request")
    default = ExpandedTile()
    p.add_argument("--block-m", type=int, default=default.block_m)
    p.add_argument("--block-n", type=int, default=default.block_n)
    p.add_argument("--warps", type=int, default=default.warps)
    p.add_argument("--stages", type=int, default=default.stages)
    return p.parse_args(argv)


def chunk_case(device, dims, batch: int, rows: int, history: int, heads: int, seed: int = 0):
    """Arguments of the kernel for ``batch`` requests of ``rows`` new rows after ``history``
    keys each: keys in position order, rows of request r at positions history .. history+rows-1."""
    g = torch.Generator(device=device).manual_seed(seed)
    d_n, d_r, d_v, dtype = dims["d_n"], dims["d_r"], dims["d_v"], dims["dtype"]
    keys = history + rows
    kvb = torch.randn(batch * keys, heads, d_n + d_v, generator=g, device=device, dtype=dtype)
    q = torch.randn(batch * rows, heads, d_n + d_r, generator=g, device=device, dtype=dtype)
    k_rope = torch.randn(batch * keys, d_r, generator=g, device=device, dtype=dtype)
    i32 = {"dtype": torch.int32, "device": device}
    q_req = torch.arange(batch, **i32).repeat_interleave(rows)
    q_pos = (history + torch.arange(rows, **i32)).repeat(batch)
    k_start = torch.arange(batch + 1, **i32) * keys
    k_pos = torch.arange(keys, **i32).repeat(batch)
    return q, kvb[..., :d_n], k_rope, kvb[..., d_n:], q_req, q_pos, k_start, k_pos, (d_n + d_r) ** -0.5


def visible_pairs(batch: int, rows: int, history: int) -> int:
    return batch * (rows * history + rows * (rows + 1) // 2)


def time_ms(fn, device) -> float:
    if device.type == "cpu":
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=30, return_mode="median")


def host_ms(fn, reps: int = 5) -> float:
    """Median wall time of ``fn`` (host work that waits for the device itself)."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[reps // 2]


def first_call_ms(fn, device) -> float:
    """Wall time of a provider's first call on a shape: a Triton compile (first point only) or a
    cuDNN graph build (every new shape: serving meets new history lengths all the time)."""
    t0 = time.perf_counter()
    fn()
    if device.type != "cpu":
        torch.accelerator.synchronize()
    return (time.perf_counter() - t0) * 1e3


def plan_ms(case, block_m: int, device) -> float:
    """Time of the launch plan (row blocks and key bounds) the kernel computes once per set of
    index tensors and reuses while they come back (as every layer of a step passes them)."""
    from splash_core.kernels.attention import _row_blocks
    from splash_core.kernels.expanded import key_bounds

    q_req, q_pos, k_start, k_pos = case[4], case[5], case[6], case[7]

    def plan():
        order, start, length, _ = _row_blocks(q_req, k_start.numel() - 1, block_m)
        return key_bounds(q_req, q_pos, k_start, k_pos, order, start, length)

    return time_ms(plan, device)


def correctness(kernel, device, dims) -> dict:
    """The conformance suite's expanded case in the benchmark's dtype against the float32
    reference: four requests (history, keys out of order, CP-style gaps, none), rows interleaved,
    rows that see nothing. An error is recorded, not raised."""
    heads = min(dims["heads"], 16)
    call = expanded_case(device, dims["dtype"], heads=heads, dims=(dims["d_n"], dims["d_r"], dims["d_v"]))
    try:
        out, lse = kernel(*call)
    except RuntimeError as exc:
        return {"correct": False, "error": str(exc).splitlines()[0], "heads": heads}
    ref_out, ref_lse = reference(*call)
    seen = ~torch.isneginf(ref_lse)
    atol, rtol = tolerance(dims["dtype"])
    ok = (bool(seen.any()) and bool((~seen).any()) and torch.equal(torch.isneginf(lse), ~seen)
          and bool(torch.all(out[~seen] == 0)) and bool(torch.isfinite(out).all())
          and torch.allclose(out.float(), ref_out.float(), atol=atol, rtol=rtol)
          and torch.allclose(lse[seen], ref_lse[seen], atol=atol, rtol=rtol))
    return {"correct": bool(ok), "heads": heads, "rows": int(call[0].shape[0]), "keys": int(call[7].numel()),
            "max_abs_err_out": float((out.float() - ref_out.float()).abs().max()),
            "max_abs_err_lse": float((lse[seen] - ref_lse[seen]).abs().max()), "atol": atol, "rtol": rtol}


def matmul_tflops(device, n: int, dtype) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty_like(a)
    return 2 * n**3 / (time_ms(lambda: torch.matmul(a, b, out=out), device) / 1e3) / 1e12


def _kind(device) -> str:
    return "cpu" if device.type == "cpu" else "accelerator"


def providers(device, tile: ExpandedTile, buckets: BucketSizes | None = None) -> dict:
    """name -> expanded attention: Triton, and torch's SDPA kernels through the SDPA provider
    (Triton serving the requests a dense call cannot express); ``sdpa_buckets`` where ``buckets``."""
    triton = triton_expanded_attention(tile)
    found = {"triton": triton}
    for name, backend in SDPA[_kind(device)].items():
        found[name] = sdpa_expanded_attention(backend, fallback=triton, group=name != "sdpa_per_request")
    if buckets is not None:
        found["sdpa_buckets"] = sdpa_expanded_attention(SDPA[_kind(device)]["sdpa"], fallback=triton, buckets=buckets)
    return found


def warm_up(provider, device, dims, rows: int, context: int) -> dict:
    """The bucketed provider's warm-up for a deployment of ``rows`` rows a call and ``context``
    keys at the benchmark's heads and widths: shapes built and wall time."""
    t0 = time.perf_counter()
    shapes = provider.warm_up(dims["heads"], (dims["d_n"], dims["d_r"], dims["d_v"]), dims["dtype"], device,
                              rows, context)
    if device.type != "cpu":
        torch.accelerator.synchronize()
    return {"shapes": shapes, "seconds": time.perf_counter() - t0, "max_rows": rows, "max_context": context}


def measure_point(kernels: dict, usable: set, device, dims, point, block_m: int) -> dict:
    """One point: every usable provider's time and rate (``<name>_ms``, ``<name>_tflops``; Triton's
    as ``ms``/``tflops``), an SDPA provider's error as ``<name>_error``."""
    batch, rows, history, heads = point
    case = chunk_case(device, dims, batch, rows, history, heads)
    pairs = visible_pairs(batch, rows, history)
    flops = pairs * 2 * (dims["d_n"] + dims["d_r"] + dims["d_v"]) * heads
    sample = {"batch": batch, "rows_per_request": rows, "history": history, "heads": heads, "rows": batch * rows,
              "visible_pairs": pairs, "flops": flops}
    for name, kernel in kernels.items():
        if name not in usable or (name == "sdpa_per_request" and batch == 1):
            continue  # one request: per-request calls are the batched call
        key = "" if name == "triton" else f"{name}_"
        try:
            sample[f"{key}first_call_ms"] = first_call_ms(lambda: kernel(*case), device)
            ms = time_ms(lambda: kernel(*case), device)
        except RuntimeError as exc:
            sample[f"{key}error"] = str(exc).splitlines()[0]
            continue
        sample[f"{key}ms"], sample[f"{key}tflops"] = ms, flops / (ms / 1e3) / 1e12
    sample["plan_ms"] = plan_ms(case, block_m, device)
    sample["sdpa_plan_ms"] = host_ms(lambda: host_plan(*case[4:8]))
    if "sdpa_buckets" in kernels:
        sample["sdpa_buckets_plan_ms"] = host_ms(lambda: host_plan(*case[4:8], buckets=kernels["sdpa_buckets"].buckets))
    return sample


def _line(s: dict, names) -> str:
    keys = {n: "" if n == "triton" else n + "_" for n in names}
    rates = "  ".join(f"{n} {s[k + 'ms']:.2f} ms {s[k + 'tflops']:.0f} TFLOP/s"
                      for n, k in keys.items() if k + "ms" in s)
    errors = "  ".join(f"{n}: {s[k + 'error']}" for n, k in keys.items() if k + "error" in s)
    return (f"B={s['batch']:2d} rows={s['rows_per_request']:5d} history={s['history']:6d} H={s['heads']:3d}  "
            f"{rates}  {errors}".rstrip())


def run(args) -> dict:
    device = torch.device("cpu" if args.tiny else "cuda")
    dims = TINY if args.tiny else FULL
    tile = (ExpandedTile(block_m=16, block_n=16, warps=1, stages=1) if args.tiny else
            ExpandedTile(block_m=args.block_m, block_n=args.block_n, warps=args.warps, stages=args.stages))
    buckets = None
    if args.buckets:
        buckets = dims.get("buckets") or BucketSizes(args.granularity, args.smallest_rows, args.row_step)
    kernels = providers(device, tile, buckets)
    checks = {name: correctness(kernel, device, dims) for name, kernel in kernels.items()}
    print(f"correctness: {checks}", flush=True)
    usable = {name for name, check in checks.items() if check["correct"] or name == "triton"}
    warmed = None
    if "sdpa_buckets" in usable:
        warmed = warm_up(kernels["sdpa_buckets"], device, dims, *dims.get("warm", (args.warm_rows, args.warm_context)))
        print(f"sdpa_buckets warm-up: {warmed}", flush=True)
    chosen = "sdpa_buckets" if buckets is not None else "sdpa"
    samples = []
    for point in dims["points"]:
        block_m = tile.fitted(point[0] * point[1], point[0] * (point[1] + point[2])).block_m
        samples.append(measure_point(kernels, usable, device, dims, point, block_m))
        print(_line(samples[-1], kernels), flush=True)
    rates = {"matmul_tflops": matmul_tflops(device, dims["matmul"], dims["dtype"]), "matmul_n": dims["matmul"]}
    choice = expanded_thresholds([{"heads": s["heads"], "rows": s["rows"], "triton_ms": s["ms"],
                                   "sdpa_ms": s.get(f"{chosen}_ms")} for s in samples])
    summary = {"correctness": checks["triton"], "provider_correctness": checks, "tile": tile.label(), "rates": rates,
               "providers": {"triton": "triton", **{n: b.name for n, b in SDPA[_kind(device)].items()}},
               "expanded_choice": choice, "chosen_sdpa": chosen, "warm_up": warmed,
               "buckets": None if buckets is None else dataclasses.asdict(buckets),
               "dims": {k: (str(v).removeprefix("torch.") if k == "dtype" else v)
                        for k, v in dims.items() if k in ("heads", "d_n", "d_r", "d_v", "dtype")}}
    print(f"matmul {rates['matmul_tflops']:.1f} TFLOP/s; choice {choice}", flush=True)
    return {"samples": samples, "summary": summary}


def write_providers(path: str, choice: dict, command: str, buckets: dict | None = None) -> None:
    """Set the ``expanded`` entry of the hopper backend's provider table (other entries kept), with
    the shape buckets the chosen SDPA provider was measured with (None: exact shapes)."""
    provider_table.set_entries(path, {"expanded": {"heads": choice, **provider_table.provenance(command, machine_description()),
                                                   **({"buckets": buckets} if buckets else {})}})


NOTES = ("expanded (MHA-form) MLA prefill attention over kv_b-expanded keys; TFLOP/s = visible (query, key) pairs "
         "x 2*(d_n+d_r+d_v)*H / time, visible pairs = B*(rows*history + rows*(rows+1)/2); times are do_bench medians "
         "(L2 flushed), each provider's plan cached as across a step's layers (plan_ms: Triton's device plan afresh; "
         "sdpa_plan_ms: the SDPA provider's host plan afresh, its device-to-host copy included); SDPA times include "
         "the key copies that broadcast the rotary key to every head; first_call_ms: a provider's first call on the "
         "shape (Triton compile, cuDNN graph build); sdpa_buckets (--buckets): the SDPA provider on shape buckets "
         "(its time includes the padded copies and the padding's work; TFLOP/s counts real pairs only), timed after "
         "its warm-up (summary.warm_up: shapes built and seconds), so its first_call_ms is what the warm-up missed; "
         "summary.chosen_sdpa names the SDPA variant the provider choice weighed against Triton")


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python3 bench/expanded_attention.py " + " ".join(argv if argv is not None else sys.argv[1:])
    data = run(args)
    platform = "cpu" if args.tiny else args.platform or accelerator_platform()
    result = make_result(benchmark="expanded_attention", platform=platform,
                         backend="triton+sdpa", model="deepseek-v3", T=1, dtype=data["summary"]["dims"]["dtype"],
                         samples=data["samples"], summary=data["summary"], command=command,
                         notes=NOTES)
    print("wrote", write_result(result, args.out))
    if args.write_providers:
        write_providers(args.write_providers, data["summary"]["expanded_choice"], command, data["summary"]["buckets"])
        print("expanded providers ->", args.write_providers, flush=True)
    wrong = [name for name, check in data["summary"]["provider_correctness"].items()
             if not check["correct"] and "error" not in check]
    return 1 if wrong or not data["summary"]["correctness"]["correct"] else 0


if __name__ == "__main__":
    sys.exit(main())
