"""Expanded-form prefill attention (``expanded_attention``, ``bench/expanded_attention.py``): the
Triton kernel's time and rate per point beside the matmul rate and flash SDPA of the same run."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import ms, table


def render(result: Result, _ctx: Context) -> list[str]:
    s = result["summary"]
    dims, sdpa, check = s["dims"], s.get("sdpa") or {}, s["correctness"]
    lines = [f"Tile {s['tile']}; H = {dims['heads']}, keys {dims['d_n']} + {dims['d_r']}, values {dims['d_v']}, "
             f"{dims['dtype']}; FLOPs count visible (query, key) pairs only. Matmul in the same run: "
             f"{s['rates']['matmul_tflops']:.0f} TFLOP/s. Against the reference: "
             f"{'correct' if check['correct'] else 'WRONG'} (max |error| {check['max_abs_err_out']:.3g})."]
    if sdpa:
        lines[-1] += (f" Flash SDPA ({sdpa.get('backend', '?')}) on the {sdpa['rows']:,}-row fresh chunk: "
                      f"{sdpa['ms']:.2f} ms, {sdpa['tflops']:.0f} TFLOP/s ({sdpa.get('note', '')}).")
    rows = [[str(p["batch"]), f"{p['rows_per_request']:,}", f"{p['history']:,}", ms(p["ms"]), f"{p['tflops']:.0f}",
             ms(p["plan_ms"])] for p in result["samples"]]
    return lines + [""] + table(["B", "rows each", "history", "ms", "TFLOP/s", "plan ms"], rows, "rrrrrr") + [""]
