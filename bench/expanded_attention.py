#!/usr/bin/env python
"""Expanded (MHA-form) MLA prefill attention on one GPU (issue 23 §1).

    python3 bench/expanded_attention.py --out OUT [--platform h200] [--block-m 128 --block-n 64 --warps 8 --stages 3]
    python3 bench/expanded_attention.py --tiny --out /tmp/x     # the script's logic on CPU (Triton interpreter)

Times :func:`splash_core.kernels.triton_expanded_attention` at DeepSeek-V3 widths (128 heads,
d_n 128, d_r 64, d_v 128, bf16) on prefill chunks after history: (B=1, 8192 rows, history 0 /
8K / 56K), (B=4, 2048 rows each, history 0 / 8K), (B=16, 512 rows each, history 8K). Keys come
as kv_b's output does: k_nope and v views of one [M, H, 256] tensor, the rotary key [M, 64]
shared by every head. Per point: Triton's ``do_bench`` median (L2 flushed), and TFLOP/s over
the visible (query, key) pairs only, 2·(192 + 128)·H FLOPs each. Beside them, from the same
run: the bf16 matmul rate (8192³) and torch's scaled_dot_product_attention (flash backend) on
the dense causal problem of the B=1, history 0 point, its values padded to 192 channels
(flash needs equal q/k and v widths; FLOPs counted as for the kernel). First, one small bf16
case (several requests, rows interleaved, a row that sees nothing) against the float32 torch
reference: its max error is recorded and a wrong kernel is flagged. Writes
``OUT/<platform>/expanded_attention.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if "--tiny" in sys.argv:  # the interpreter's flag is read when Triton kernels are defined
    os.environ["TRITON_INTERPRET"] = "1"
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from splash_core.kernels import ExpandedTile, triton_expanded_attention  # noqa: E402
from splash_core.reference.expanded import expanded_attention as reference  # noqa: E402
from splash_core.results import make_result, write_result  # noqa: E402
from splash_core.testing.mla_inputs import tolerance  # noqa: E402

FULL = {"heads": 128, "d_n": 128, "d_r": 64, "d_v": 128, "dtype": torch.bfloat16,
        "points": [(1, 8192, 0), (1, 8192, 8192), (1, 8192, 57344), (4, 2048, 0), (4, 2048, 8192), (16, 512, 8192)],
        "matmul": 8192}
# The interpreter computes bf16 dots wrongly (docs/design.md §6): the dry run uses fp16.
TINY = {"heads": 2, "d_n": 16, "d_r": 8, "d_v": 16, "dtype": torch.float16,
        "points": [(1, 32, 0), (1, 32, 32), (2, 16, 16)], "matmul": 128}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    p.add_argument("--platform", default="h200")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on CPU in Triton's interpreter")
    default = ExpandedTile()
    p.add_argument("--block-m", type=int, default=default.block_m)
    p.add_argument("--block-n", type=int, default=default.block_n)
    p.add_argument("--warps", type=int, default=default.warps)
    p.add_argument("--stages", type=int, default=default.stages)
    return p.parse_args(argv)


def chunk_case(device, dims, batch: int, rows: int, history: int, seed: int = 0):
    """Arguments of the kernel for ``batch`` requests of ``rows`` new rows after ``history``
    keys each: keys in position order, rows of request r at positions history .. history+rows-1."""
    g = torch.Generator(device=device).manual_seed(seed)
    heads, d_n, d_r, d_v, dtype = dims["heads"], dims["d_n"], dims["d_r"], dims["d_v"], dims["dtype"]
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
    """One small case in the benchmark's dtype against the float32 reference: three requests
    (one with history, one first chunk, one decode-like row), rows interleaved, plus a row
    whose request holds no key at all."""
    heads = min(dims["heads"], 16)
    parts = [chunk_case(device, {**dims, "heads": heads}, 1, rows, history, seed=s)
             for s, (rows, history) in enumerate(((37, 100), (64, 0), (1, 300)))]
    q = torch.cat([p[0] for p in parts] + [parts[0][0][:1]])
    kvb = torch.cat([torch.cat([p[1], p[3]], 2) for p in parts])
    k_rope = torch.cat([p[2] for p in parts])
    q_req = torch.cat([torch.full_like(p[4], r) for r, p in enumerate(parts)] + [parts[0][4][:1] * 0 + 3])
    q_pos = torch.cat([p[5] for p in parts] + [parts[0][5][:1]])
    sizes = torch.tensor([0] + [p[7].numel() for p in parts] + [0], device=device)
    k_start = torch.cumsum(sizes, 0).to(torch.int32)
    k_pos = torch.cat([p[7] for p in parts])
    perm = torch.randperm(q.shape[0], generator=torch.Generator().manual_seed(1)).to(device)
    d_n = dims["d_n"]
    call = (q[perm], kvb[..., :d_n], k_rope, kvb[..., d_n:], q_req[perm], q_pos[perm], k_start, k_pos,
            parts[0][-1])
    out, lse = kernel(*call)
    ref_out, ref_lse = reference(*call)
    seen = ~torch.isneginf(ref_lse)
    atol, rtol = tolerance(dims["dtype"])
    ok = (bool(seen.any()) and torch.equal(torch.isneginf(lse), ~seen) and bool(torch.all(out[~seen] == 0))
          and torch.allclose(out.float(), ref_out.float(), atol=atol, rtol=rtol)
          and torch.allclose(lse[seen], ref_lse[seen], atol=atol, rtol=rtol))
    return {"correct": bool(ok), "heads": heads, "rows": int(q.shape[0]), "keys": int(k_pos.numel()),
            "max_abs_err_out": float((out.float() - ref_out.float()).abs().max()),
            "max_abs_err_lse": float((lse[seen] - ref_lse[seen]).abs().max()), "atol": atol, "rtol": rtol}


def matmul_tflops(device, n: int, dtype) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty_like(a)
    return 2 * n**3 / (time_ms(lambda: torch.matmul(a, b, out=out), device) / 1e3) / 1e12


def sdpa_dense(device, dims, rows: int) -> dict:
    """torch's flash attention on the dense causal problem of one request of ``rows`` rows:
    q/k of d_n + d_r channels, values padded to the same width."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, width, dtype = dims["heads"], dims["d_n"] + dims["d_r"], dims["dtype"]
    q, k, v = (torch.randn(1, heads, rows, width, device=device, dtype=dtype) for _ in range(3))
    v[..., dims["d_v"]:] = 0
    backend = SDPBackend.FLASH_ATTENTION if device.type != "cpu" else SDPBackend.MATH
    try:
        with sdpa_kernel(backend):
            ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=width ** -0.5), device)
    except RuntimeError as exc:
        return {"skipped": f"{backend.name}: {str(exc).splitlines()[0]}"}
    flops = visible_pairs(1, rows, 0) * 2 * (width + dims["d_v"]) * heads
    return {"backend": backend.name, "rows": rows, "ms": ms, "tflops": flops / (ms / 1e3) / 1e12,
            "note": f"values padded from {dims['d_v']} to {width} channels (flash needs equal widths); "
                    f"FLOPs counted as 2*({width}+{dims['d_v']})*H per visible pair, as for the kernel"}


def run(args) -> dict:
    device = torch.device("cpu" if args.tiny else "cuda")
    dims = TINY if args.tiny else FULL
    tile = (ExpandedTile(block_m=16, block_n=16, warps=1, stages=1) if args.tiny else
            ExpandedTile(block_m=args.block_m, block_n=args.block_n, warps=args.warps, stages=args.stages))
    kernel = triton_expanded_attention(tile)
    check = correctness(kernel, device, dims)
    print(f"correctness: {check}", flush=True)
    samples = []
    for batch, rows, history in dims["points"]:
        case = chunk_case(device, dims, batch, rows, history)
        pairs = visible_pairs(batch, rows, history)
        ms = time_ms(lambda: kernel(*case), device)
        tflops = pairs * 2 * (dims["d_n"] + dims["d_r"] + dims["d_v"]) * dims["heads"] / (ms / 1e3) / 1e12
        samples.append({"batch": batch, "rows_per_request": rows, "history": history, "heads": dims["heads"],
                        "visible_pairs": pairs, "ms": ms, "tflops": tflops,
                        "plan_ms": plan_ms(case, tile.fitted(case[0].shape[0], case[7].numel()).block_m, device)})
        print(f"B={batch:2d} rows={rows:5d} history={history:6d}  {ms:9.3f} ms  {tflops:7.1f} TFLOP/s  "
              f"plan {samples[-1]['plan_ms']:.3f} ms", flush=True)
        del case
    rates = {"matmul_tflops": matmul_tflops(device, dims["matmul"], dims["dtype"]), "matmul_n": dims["matmul"]}
    first = dims["points"][0]
    summary = {"correctness": check, "tile": tile.label(), "rates": rates, "sdpa": sdpa_dense(device, dims, first[1]),
               "dims": {k: (str(v).removeprefix("torch.") if k == "dtype" else v)
                        for k, v in dims.items() if k in ("heads", "d_n", "d_r", "d_v", "dtype")}}
    print(f"matmul {rates['matmul_tflops']:.1f} TFLOP/s; sdpa {summary['sdpa']}", flush=True)
    return {"samples": samples, "summary": summary}


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python3 bench/expanded_attention.py " + " ".join(argv if argv is not None else sys.argv[1:])
    data = run(args)
    result = make_result(benchmark="expanded_attention", platform="cpu" if args.tiny else args.platform,
                         backend="triton", model="deepseek-v3", T=1, dtype=data["summary"]["dims"]["dtype"],
                         samples=data["samples"], summary=data["summary"], command=command,
                         notes="expanded (MHA-form) MLA prefill attention over kv_b-expanded keys; TFLOP/s over "
                               "visible (query, key) pairs only, 2*(d_n+d_r+d_v)*H FLOPs each; times are "
                               "do_bench medians (L2 flushed) with the launch plan cached, as across a step's layers; "
                               "plan_ms: that plan computed afresh")
    print("wrote", write_result(result, args.out))
    return 0 if data["summary"]["correctness"]["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
