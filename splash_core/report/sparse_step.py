"""DeepSeek Sparse Attention's step (``dsa_step``) and block-scaled FP8 GEMMs (``fp8_gemm``): per
point the wall time of dense and of each sparse provider beside the roofline measured in the same
run; per GEMM shape the Triton kernel beside bf16 and row-wise FP8 matmuls."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import MISSING, ms, sig, table, tokens


def render_dsa(result: Result, ctx: Context) -> list[str]:
    summary = result["summary"]
    rates = summary["rates"]
    notes = result.data.get("notes") or ""
    lines = [f"{notes} Ceilings measured in the same run: copy {sig(rates['copy_gbps'])} GB/s, "
             f"matmul {sig(rates['matmul_tflops'])} TFLOP/s.", ""]
    rows = [[p["cache"], p.get("phase", MISSING), tokens(p["context"]), p["provider"],
             ms(p["ms"]) if "ms" in p else p.get("error", MISSING), ms(p.get("roofline_ms")),
             f"{p['over_roofline']:.1f}x" if "over_roofline" in p else MISSING,
             ("yes" if p["tokens_match_triton"] else "**no**") if "tokens_match_triton" in p else MISSING]
            for p in summary["points"]]
    lines += table(["cache", "phase", "context", "attention", "ms", "roofline ms", "over roofline",
                    "Triton's tokens"], rows, "lllllrrl") + [""]
    chosen = ", ".join(f"{cache}: {c['provider']}" for cache, c in summary["sparse_providers"].items())
    return lines + ([f"Sparse provider chosen: {chosen}.", ""] if chosen else [])


def render_fp8_gemm(result: Result, ctx: Context) -> list[str]:
    summary = result["summary"]
    peaks = summary["peaks"]
    lines = [f"Peaks measured in the same run: bf16 {sig(peaks['bf16_tflops'])}, FP8 {sig(peaks['fp8_tflops'])} "
             "TFLOP/s.", ""]
    rows = [[name, _tf(p.get("triton_tflops")), _tf(p.get("scaled_mm_block_tflops")), _tf(p.get("bf16_tflops")),
             f"{p['triton_over_bf16']:.2f}" if "triton_over_bf16" in p else MISSING,
             f"{p['triton_over_scaled_mm_rowwise']:.2f}" if "triton_over_scaled_mm_rowwise" in p else MISSING]
            for name, p in summary["points"].items()]
    chosen = summary.get("scaled_mm_from_rows")
    return lines + table(["shape / rows", "Triton FP8 TFLOP/s", "block scaled_mm TFLOP/s", "bf16 TFLOP/s",
                          "Triton / bf16", "Triton / row-wise _scaled_mm"], rows, "lrrrrr") + [
        "", (f"Block-scaled scaled_mm faster than Triton from {chosen} rows on every whole-block shape." if chosen
             else "Block-scaled scaled_mm: not faster than Triton at every larger point, or not measured."), ""]


def _tf(value) -> str:
    return MISSING if value is None else f"{value:.1f}"
