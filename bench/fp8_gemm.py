#!/usr/bin/env python
"""FP8 block GEMM (issue 38) at DeepSeek-V3's shapes on one device: SPLASH's Triton kernel
(1 x 128 token-group activations times 128 x 128 block-scaled weights, :mod:`splash_core.kernels.fp8_block_gemm`)
beside bf16 ``torch.matmul``, torch's ``scaled_mm`` with the same block scales (cuBLAS on sm_90,
:mod:`splash_core.kernels.fp8_scaled_mm`, on whole-block weights, where torch has it) and
``torch._scaled_mm`` with row-wise scales (another quantization: a rate to compare, not a provider),
each as TFLOP/s and as a share of the bf16 and FP8 peaks measured in the same run (8192^3).

    python bench/fp8_gemm.py --out $OUT [--m 16,64,512,8192] [--shapes q_a,kv_a,...] [--platform h200]
        [--write-providers backends/hopper/splash_backend_hopper/tuned/providers.json]

``--write-providers`` sets the hopper backend's ``fp8_linear`` entry: the fewest rows from which
block-scaled ``scaled_mm`` was faster than the Triton kernel on every whole-block shape at every
measured row count from there up (None: nowhere), other entries kept.

For every shape and M it first checks the kernel's bf16 output against the spec (dequantize, then
a float32 matmul; :func:`~splash_core.model.fp8_blocks.gemm_mismatch` within ``--tolerance``), then
times each candidate tile and reports the fastest. Times are the device's (CUDA-graph replays, as a
captured decode step runs, every sample kept) over enough copies of the weight that it comes from
memory, not from the cache. Activation quantization (Triton, checked bit for bit against the torch
reference) is timed apart (``quant_ms``): the GEMM times exclude it. Shapes named ``expert_*`` are
also timed as a rank's stack of ``--experts`` experts (the grouped kernel, the rows spread evenly)
beside bf16 matmuls expert by expert.
``--smoke`` runs the same code on tiny shapes on the CPU with Triton's interpreter (``TRITON_INTERPRET=1``
set by the caller), timing with a wall clock. Writes ``<out>/<platform>/fp8_gemm.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform as host
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # uninstalled checkout

from splash_bench import provider_table  # noqa: E402
from splash_core import results  # noqa: E402
from splash_core.checkpoint.fp8 import quantize  # noqa: E402
from splash_core.kernels.fp8_block_gemm import (GemmTile, fp8_block_gemm, grouped_fp8_block_gemm,  # noqa: E402
                                                portable_tile, quantize_token_groups)
from splash_core.kernels.fp8_scaled_mm import (ROW_MULTIPLE, available, fits, operands, scaled_mm,  # noqa: E402
                                               scaled_mm_linear)
from splash_core.model.fp8_blocks import (BlockScaledFP8, TokenGroupsFP8, gemm_mismatch, quantize_tokens,  # noqa: E402
                                          reference_gemm, slice_of)


@dataclass(frozen=True)
class Shape:
    """A weight slice [n, k] of DeepSeek-V3 (7168 hidden) as one rank holds it, from ``start`` (row, col)."""

    name: str
    n: int
    k: int
    start: tuple[int, int] = (0, 0)


SHAPES = {s.name: s for s in (
    Shape("q_a", 1536, 7168), Shape("kv_a", 576, 7168),
    Shape("o_proj_tp8", 7168, 2048),  # 128 heads x 128 / 8 input channels
    Shape("q_b_tp8", 3072, 1536),  # 16 heads x 192 rows
    Shape("qkv_a_tp8_mid_block", 264, 7168, (8, 0)),  # fused q_a + kv_a rows 2112 / 8, starting mid-block
    Shape("expert_gate_up", 4096, 7168), Shape("expert_down", 7168, 2048),
    Shape("mlp_gate_up", 36864, 7168), Shape("mlp_down", 7168, 18432))}  # a dense layer's MLP at T = 1
SMOKE_SHAPES = {"smoke": Shape("smoke", 96, 320, (8, 0)), "smoke_mid_cols": Shape("smoke_mid_cols", 64, 200, (0, 40)),
                "expert_smoke": Shape("expert_smoke", 64, 256)}
GROUPED_PREFIX = "expert_"  # shapes also timed as a rank's stack of experts
TILES = [GemmTile(16, 32, 4, 5), GemmTile(16, 64, 4, 5), GemmTile(32, 128, 4, 4), GemmTile(64, 32, 4, 5),
         GemmTile(64, 64, 4, 5), GemmTile(64, 128, 4, 3), GemmTile(64, 256, 8, 3), GemmTile(128, 128, 8, 3),
         GemmTile(128, 256, 8, 3)]
# y^T = W x^T for decode-sized batches: the weight's rows fill the MMA's 64-row side
SWAPPED_TILES = [GemmTile(16, 64, 4, 4, swap=True), GemmTile(16, 128, 4, 4, swap=True), GemmTile(16, 128, 8, 3, swap=True),
                 GemmTile(32, 128, 4, 4, swap=True), GemmTile(64, 128, 4, 3, swap=True)]
PEAK = 8192
ROTATE_BYTES = 256 << 20  # over four times the last-level cache of an H100 or H200
SAMPLES = 10


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/<platform>/")
    p.add_argument("--platform", default=None, help="results folder (default: h200 or h100 by the GPU's name; "
                                                    "cpu with --smoke)")
    p.add_argument("--m", default="16,64,512,8192", help="activation rows, comma-separated")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    p.add_argument("--rep-ms", type=int, default=20, help="device time of one sample (a graph replay), ms")
    p.add_argument("--tolerance", type=float, default=2 ** -7, help="kernel vs spec, share of the largest |y|")
    p.add_argument("--experts", type=int, default=32, help="experts a rank holds for the grouped kernel "
                   "(DeepSeek-V3's 256 over T = 8); 0: skip it")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton's interpreter)")
    p.add_argument("--write-providers", metavar="FILE", help="record from how many rows block-scaled scaled_mm "
                   "serves whole-block weights (the hopper backend's fp8_linear entry)")
    p.add_argument("--write-tiles", metavar="FILE", help="record the fastest Triton tile of each weight shape at "
                   "each measured row count (the hopper backend's fp8_tiles entry; other shapes kept)")
    args = p.parse_args(argv)
    args.m = _rows(p, args.m)
    table = SMOKE_SHAPES if args.smoke else SHAPES
    names = [s for s in args.shapes.split(",") if s] if not args.smoke else list(SMOKE_SHAPES)
    unknown = [s for s in names if s not in table]
    if unknown or not names:
        p.error(f"--shapes: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(table)}")
    args.shapes = [table[s] for s in names]
    args.platform = args.platform or ("cpu" if args.smoke else None)  # a GPU's: named in main, once it is seen
    if args.experts < 0:
        p.error(f"--experts must be >= 0 (got {args.experts})")
    if args.smoke:
        args.m, args.experts = [min(m, 20) for m in args.m[:2]], min(args.experts, 3)
    return args


def _rows(p: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        rows = [int(v) for v in text.split(",") if v]
    except ValueError:
        p.error(f"--m takes comma-separated integers (got {text!r})")
    if not rows or min(rows) < 1:
        p.error("--m needs at least one row count, each >= 1")
    return rows


def tiles_for(shape: Shape, m: int, smoke: bool) -> list[GemmTile]:
    """Candidate tiles for ``m`` rows: the portable default first, then none much taller than the
    batch, with the column blocks split for small batches (in the interpreter: two small tiles)."""
    default = portable_tile(m, shape.n, shape.k)
    if smoke:
        return [default, GemmTile(16, 32, 1, 1, 2), GemmTile(16, 32, 1, 1, swap=True)]
    splits = (1, 4, 8, 16) if m <= 64 else (1, 2, 4) if m <= 512 else (1,)
    candidates = TILES + (SWAPPED_TILES if m <= 64 else [])
    return [default, *(replace(t, split_k=s) for t in candidates if t.block_m <= max(16, 2 * m) for s in splits)]


def tile_fields(tile: GemmTile) -> list[int]:
    return [tile.block_m, tile.block_n, tile.warps, tile.stages, tile.split_k, int(tile.swap)]


def timer(device: torch.device, rep_ms: int):
    """``time(calls) -> list of ms per call``: each sample replays a graph of the ``calls`` in turn (each
    on its own copy of the operands, so weights come from memory, not from the cache), the device's
    time without the host's launch cost, as a captured decode step runs; on the CPU, wall-clock rounds."""
    def on_cpu(calls):
        for fn in calls:
            fn()
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            for fn in calls:
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / len(calls))
        return samples

    def on_device(calls):
        for fn in calls:
            fn()  # compiles, allocates
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for fn in calls:
            fn()
        torch.cuda.synchronize()
        rounds = max(1, min(1000, int(rep_ms / 1e3 / max(time.perf_counter() - t0, 1e-6))))  # ~rep_ms a replay
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            for _ in range(rounds):
                for fn in calls:
                    fn()
        graph.replay()
        samples = []
        for _ in range(SAMPLES):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / (rounds * len(calls)))
        return samples

    return on_cpu if device.type == "cpu" else on_device


def copies_for(nbytes: int, smoke: bool) -> int:
    """Copies of a weight of ``nbytes`` to cycle through so that together they overflow any cache."""
    return 1 if smoke else max(1, min(64, -(-ROTATE_BYTES // max(nbytes, 1))))


def scaled_mm_rowwise(a8, a_scale, b8, b_scale):
    """torch._scaled_mm with one scale per row of ``a8`` and per column of ``b8`` (``b8``: [k, n] column-major)."""
    return torch._scaled_mm(a8, b8, scale_a=a_scale, scale_b=b_scale, out_dtype=torch.bfloat16)


def rowwise_operands(x: torch.Tensor, w: torch.Tensor):
    """e4m3 operands with one scale per activation row and per weight row, for :func:`scaled_mm_rowwise`."""
    xs = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / 448.0
    ws = w.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (x / xs).to(torch.float8_e4m3fn), xs, (w / ws).to(torch.float8_e4m3fn).T, ws.T


def peaks(device: torch.device, time_ms) -> dict:
    """bf16 and FP8 (per-tensor _scaled_mm) TFLOP/s at 8192^3 in this run (0.0 where unavailable)."""
    if device.type == "cpu":
        return {"bf16_tflops": 0.0, "fp8_tflops": 0.0}
    a = torch.randn(PEAK, PEAK, device=device, dtype=torch.bfloat16)
    flop = 2 * PEAK ** 3
    out = {"bf16_tflops": flop / statistics.median(time_ms([lambda: a @ a])) / 1e9}
    try:
        a8, one = a.to(torch.float8_e4m3fn), torch.ones((), device=device)
        out["fp8_tflops"] = flop / statistics.median(time_ms(
            [lambda: torch._scaled_mm(a8, a8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)])) / 1e9
    except (RuntimeError, AttributeError) as exc:
        out["fp8_tflops"], out["fp8_unavailable"] = 0.0, str(exc).splitlines()[0]
    return out


def point(shape: Shape, m: int, device: torch.device, time_ms, args) -> dict:
    """One shape at ``m`` rows: correctness of each tile's output, then the times of all three."""
    g = torch.Generator(device=device).manual_seed(m)
    full = torch.randn(shape.start[0] + shape.n, shape.start[1] + shape.k, generator=g, device=device) * 0.05
    w = slice_of(*quantize(full), slice(shape.start[0], None), slice(shape.start[1], None))
    x = torch.randn(m, shape.k, generator=g, device=device).to(torch.bfloat16)
    xq = quantized(x, w.start[1], shape.name)
    out = torch.float32 if device.type == "cpu" else torch.bfloat16  # the interpreter rounds to bf16 by truncation
    want = reference_gemm(xq, w)
    ws = [w, *(BlockScaledFP8(w.codes.clone(), w.scales.clone(), w.start) for _ in range(
        copies_for(w.stored_bytes, args.smoke) - 1))]
    flop = 2 * m * shape.n * shape.k
    row = {"shape": shape.name, "m": m, "n": shape.n, "k": shape.k, "start": list(shape.start), "tiles": []}
    for tile in tiles_for(shape, m, args.smoke):
        wrong = gemm_mismatch(fp8_block_gemm(xq, w, out, tile).float(), want, args.tolerance)
        if wrong:
            raise SystemExit(f"fp8_gemm: {shape.name} m={m} tile {tile}: kernel disagrees with the spec: {wrong}")
        samples = time_ms([lambda w=w: fp8_block_gemm(xq, w, out, tile) for w in ws])
        row["tiles"].append({"tile": tile_fields(tile),
                             "ms": samples, "tflops": flop / statistics.median(samples) / 1e9})
    best = max(row["tiles"], key=lambda t: t["tflops"])
    row.update(triton_tflops=best["tflops"], triton_tile=best["tile"], default_tflops=row["tiles"][0]["tflops"])
    row["quant_ms"] = time_ms([lambda: quantize_token_groups(x, w.start[1])])
    del ws
    w16 = w.dequantize().to(torch.bfloat16)
    w16s = [w16, *(w16.clone() for _ in range(copies_for(w16.numel() * 2, args.smoke) - 1))]
    row["bf16_ms"] = time_ms([lambda w16=w16: x @ w16.T for w16 in w16s])
    row["bf16_tflops"] = flop / statistics.median(row["bf16_ms"]) / 1e9
    del w16s
    row.update(rowwise_scaled_mm(x, w16, flop, time_ms, copies_for(w.codes.numel(), args.smoke)))
    row.update(block_scaled_mm(x, w, want, flop, time_ms, args))
    return row


def block_scaled_mm(x: torch.Tensor, w: BlockScaledFP8, want: torch.Tensor, flop: int, time_ms, args) -> dict:
    """Times of torch's ``scaled_mm`` with the same block scales (activations quantized beforehand, rows
    padded to 16, as the provider runs it), after its output is checked against the spec; or why not."""
    why = "the slice is not whole 128-blocks" if not fits(w) else available(x.device)
    if why:
        return {"scaled_mm_block_unavailable": why}
    m = x.shape[0]
    xq = quantize_token_groups(torch.nn.functional.pad(x, (0, 0, 0, -m % ROW_MULTIPLE)))
    got = scaled_mm_linear(quantize_token_groups)(x, w)
    wrong = gemm_mismatch(got.float(), want, args.tolerance)
    if wrong:
        raise SystemExit(f"fp8_gemm: scaled_mm with block scales disagrees with the spec: {wrong}")
    ws = [w, *(BlockScaledFP8(w.codes.clone(), w.scales.clone()) for _ in range(
        copies_for(w.stored_bytes, args.smoke) - 1))]
    samples = time_ms([lambda c=operands(xq, v): scaled_mm(*c, torch.bfloat16) for v in ws])
    return {"scaled_mm_block_ms": samples, "scaled_mm_block_tflops": flop / statistics.median(samples) / 1e9}


def scaled_mm_threshold(rows: list[dict]) -> int | None:
    """The fewest rows from which block-scaled ``scaled_mm`` beat the Triton kernel on every shape it
    takes at every measured row count from there up (None: nowhere, or nothing measured)."""
    measured = [r for r in rows if "scaled_mm_block_tflops" in r]
    start = None
    for m in sorted({r["m"] for r in measured}, reverse=True):
        if any(r["scaled_mm_block_tflops"] <= r["triton_tflops"] for r in measured if r["m"] == m):
            break
        start = m
    return start


def write_providers(path: str, rows: list[dict], command: str, machine: str) -> dict:
    """Set the ``fp8_linear`` entry of the hopper backend's provider table (other entries kept)."""
    entry = {"scaled_mm_from_rows": scaled_mm_threshold(rows), "points": sum("scaled_mm_block_tflops" in r for r in rows),
             **provider_table.provenance(command, machine)}
    return provider_table.set_entries(path, {"fp8_linear": entry})["fp8_linear"]


def write_tiles(path: str, rows: list[dict], command: str, machine: str) -> dict:
    """Set the ``fp8_tiles`` entry: each plain (not grouped) row's fastest tile under its weight
    shape ``"<n>x<k>"`` and row count, the shapes and row counts this run did not measure kept."""
    old = json.loads(Path(path).read_text()).get("fp8_tiles", {}) if Path(path).is_file() else {}
    weights = {key: dict(points) for key, points in old.get("weights", {}).items()}
    for r in rows:
        if "experts" not in r:
            weights.setdefault(f"{r['n']}x{r['k']}", {})[str(r["m"])] = r["triton_tile"]
    entry = {"weights": weights, **provider_table.provenance(command, machine)}
    return provider_table.set_entries(path, {"fp8_tiles": entry})["fp8_tiles"]


def quantized(x: torch.Tensor, start: int, name: str) -> TokenGroupsFP8:
    """``x`` quantized by the Triton kernel, which must equal the torch reference bit for bit."""
    got, want = quantize_token_groups(x, start), quantize_tokens(x, start=start)
    if not (torch.equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8)) and torch.equal(got.scales,
                                                                                                  want.scales)):
        raise SystemExit(f"fp8_gemm: {name}: the Triton activation quantizer disagrees with the reference")
    return got


def grouped_point(shape: Shape, m: int, experts: int, device: torch.device, time_ms, args) -> dict:
    """``m`` routed rows spread evenly over ``experts`` experts of ``shape`` (a rank's share of a MoE
    layer): the grouped kernel, checked against the spec expert by expert, beside bf16 matmuls per expert."""
    g = torch.Generator(device=device).manual_seed(m + 1)
    parts = [quantize(torch.randn(shape.n, shape.k, generator=g, device=device) * 0.05) for _ in range(experts)]
    w = BlockScaledFP8(torch.stack([c for c, _ in parts]), torch.stack([s for _, s in parts]))
    del parts
    counts = [m // experts + (e < m % experts) for e in range(experts)]
    bounds = list(zip([0, *itertools.accumulate(counts)], itertools.accumulate(counts)))
    offsets = torch.tensor([0, *itertools.accumulate(counts)], device=device)
    x = torch.randn(m, shape.k, generator=g, device=device).to(torch.bfloat16)
    xq = quantized(x, 0, shape.name)
    want = torch.cat([reference_gemm(TokenGroupsFP8(xq.codes[a:b], xq.scales[a:b]), w.expert(e))
                      for e, (a, b) in enumerate(bounds)])
    out = torch.float32 if device.type == "cpu" else torch.bfloat16
    flop, most = 2 * m * shape.n * shape.k, max(counts)
    row = {"shape": f"{shape.name}_x{experts}", "m": m, "n": shape.n, "k": shape.k, "experts": experts,
           "start": [0, 0], "tiles": []}
    default = portable_tile(most, shape.n, shape.k)
    tiles = [default, *(t for t in TILES if t.block_m <= max(16, 2 * most) and t != default)]
    for tile in tiles[:1 if args.smoke else 4]:
        got = grouped_fp8_block_gemm(xq, w, offsets, out, tile, max_rows=most)
        wrong = gemm_mismatch(got.float(), want, args.tolerance)
        if wrong:
            raise SystemExit(f"fp8_gemm: {row['shape']} m={m} tile {tile}: kernel disagrees with the spec: {wrong}")
        samples = time_ms([lambda: grouped_fp8_block_gemm(xq, w, offsets, out, tile, max_rows=most)])
        row["tiles"].append({"tile": tile_fields(tile),
                             "ms": samples, "tflops": flop / statistics.median(samples) / 1e9})
    best = max(row["tiles"], key=lambda t: t["tflops"])
    row.update(triton_tflops=best["tflops"], triton_tile=best["tile"], default_tflops=row["tiles"][0]["tflops"])
    w16 = [(torch.randn(shape.n, shape.k, generator=g, device=device) * 0.05).to(torch.bfloat16)
           for _ in range(experts)]
    row["bf16_ms"] = time_ms([lambda: [x[a:b] @ w16[e].T for e, (a, b) in enumerate(bounds) if b > a]])
    row["bf16_tflops"] = flop / statistics.median(row["bf16_ms"]) / 1e9
    return row


def rowwise_scaled_mm(x: torch.Tensor, w16: torch.Tensor, flop: int, time_ms, copies: int) -> dict:
    """Times of torch._scaled_mm row-wise on the same shape (``copies`` of the weight), or why it could not run."""
    try:
        a8, a_scale, b8, b_scale = rowwise_operands(x, w16)
        weights = [(b8, b_scale), *((b8.T.clone().T, b_scale.clone()) for _ in range(copies - 1))]
        samples = time_ms([lambda b=b, s=s: scaled_mm_rowwise(a8, a_scale, b, s) for b, s in weights])
    except (RuntimeError, AttributeError, TypeError) as exc:
        return {"scaled_mm_rowwise_unavailable": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
    return {"scaled_mm_rowwise_ms": samples, "scaled_mm_rowwise_tflops": flop / statistics.median(samples) / 1e9}


def summarize(rows: list[dict], peak: dict) -> dict:
    """Per shape and M: TFLOP/s of each and their shares of the peaks; the kernel over bf16 and _scaled_mm."""
    out = {}
    for r in rows:
        key = f"{r['shape']}/m{r['m']}"
        out[key] = {"triton_tflops": r["triton_tflops"], "triton_default_tile_tflops": r["default_tflops"],
                    "bf16_tflops": r["bf16_tflops"],
                    "triton_over_bf16": r["triton_tflops"] / r["bf16_tflops"],
                    "triton_of_fp8_peak": r["triton_tflops"] / peak["fp8_tflops"] if peak["fp8_tflops"] else 0.0,
                    "bf16_of_bf16_peak": r["bf16_tflops"] / peak["bf16_tflops"] if peak["bf16_tflops"] else 0.0}
        if "scaled_mm_rowwise_tflops" in r:
            out[key]["triton_over_scaled_mm_rowwise"] = r["triton_tflops"] / r["scaled_mm_rowwise_tflops"]
        if "scaled_mm_block_tflops" in r:
            out[key].update(scaled_mm_block_tflops=r["scaled_mm_block_tflops"],
                            scaled_mm_block_over_bf16=r["scaled_mm_block_tflops"] / r["bf16_tflops"],
                            scaled_mm_block_of_fp8_peak=(r["scaled_mm_block_tflops"] / peak["fp8_tflops"]
                                                         if peak["fp8_tflops"] else 0.0))
    chosen = scaled_mm_threshold(rows)
    return {"peaks": peak, "points": out, **({"scaled_mm_from_rows": chosen} if chosen else {})}


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("fp8_gemm: no GPU visible to torch; run it on the device machine (or --smoke on a CPU)",
              file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.platform is None:
        name = torch.cuda.get_device_name(0)
        args.platform = "h200" if "H200" in name else "h100" if "H100" in name else "gpu"
    time_ms = timer(device, args.rep_ms)
    start = time.time()
    peak = peaks(device, time_ms)
    print(f"peaks: bf16 {peak['bf16_tflops']:.0f} TFLOP/s, fp8 {peak['fp8_tflops']:.0f} TFLOP/s", flush=True)
    rows = []
    for shape in args.shapes:
        for m in args.m:
            r = point(shape, m, device, time_ms, args)
            print(f"{shape.name:>20} m={m:<5} triton {r['triton_tflops']:7.1f} (tile {r['triton_tile']}; default "
                  f"{r['default_tflops']:.1f})  bf16 "
                  f"{r['bf16_tflops']:7.1f}  scaled_mm row-wise {r.get('scaled_mm_rowwise_tflops', float('nan')):7.1f}"
                  f"  block {r.get('scaled_mm_block_tflops', float('nan')):7.1f} TFLOP/s", flush=True)
            rows.append(r)
    for shape in [s for s in args.shapes if s.name.startswith(GROUPED_PREFIX)] if args.experts else []:
        for m in args.m:
            r = grouped_point(shape, m, args.experts, device, time_ms, args)
            print(f"{r['shape']:>20} m={m:<5} triton {r['triton_tflops']:7.1f} (tile {r['triton_tile']}; default "
                  f"{r['default_tflops']:.1f})  bf16 per expert {r['bf16_tflops']:7.1f} TFLOP/s", flush=True)
            rows.append(r)
    data = results.make_result(
        benchmark="fp8_gemm", platform=args.platform, backend="triton", model="deepseek-v3", T=1, dtype="fp8_e4m3",
        samples=rows, summary=summarize(rows, peak),
        notes=("y = x W^T, x 1x128 token groups, W 128x128 blocks (weights x0.05 normal, x normal bf16); times in "
               "ms per call (graph replays over copies of the weight past 256 MiB); GEMM times exclude activation "
               "quantization (quant_ms); "
               "scaled_mm_block: torch's scaled_mm with the same 1x128 / 128x128 scales (whole-block shapes); "
               "_scaled_mm row-wise uses one scale per row of x and W; "
               "tile = [block_m, block_n, warps, stages, split_k, swap], "
               "the first of each point the portable default"))
    print("wrote", results.write_result(data, args.out), f"({time.time() - start:.0f} s)", flush=True)
    machine = f"{host.node()} {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu'}"
    if args.write_providers:
        entry = write_providers(args.write_providers, rows, " ".join(sys.argv), machine)
        print("fp8_linear provider:", entry["scaled_mm_from_rows"], "->", args.write_providers, flush=True)
    if args.write_tiles:
        entry = write_tiles(args.write_tiles, rows, " ".join(sys.argv), machine)
        print(f"fp8 tiles of {len(entry['weights'])} weight shapes ->", args.write_tiles, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
