"""Expanded-form prefill attention (``expanded_attention``, ``bench/expanded_attention.py``): the
Triton kernel's time and rate per point beside the matmul rate and the torch-SDPA providers of the
same run (cuDNN attention, batched or per request; the memory-efficient kernel), with each one's first
call on a shape."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import MISSING, ms, table


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
    providers = [name for name in (s.get("providers") or {}) if name != "triton"]
    rows = [[str(p["batch"]), str(p.get("heads", dims["heads"])), f"{p['rows_per_request']:,}", f"{p['history']:,}",
             ms(p["ms"]), f"{p['tflops']:.0f}", ms(p["plan_ms"])] + _others(p, providers) for p in result["samples"]]
    head = ["B", "H", "rows each", "history", "Triton ms", "TFLOP/s", "plan ms"]
    head += [f"{name} {what}" for name in providers for what in ("TFLOP/s", "first call ms")]
    lines += [""] + table(head, rows, "r" * len(head)) + [""]
    if providers:
        lines += [f"Providers: {', '.join(f'{k} = {v}' for k, v in s['providers'].items())}. The first call on a "
                  "shape compiles (Triton) or builds a graph (cuDNN); a serving run meets a new shape with every "
                  "new chunk length and history.", ""]
    return lines


def _others(point: dict, providers: list[str]) -> list[str]:
    out = []
    for name in providers:
        if f"{name}_ms" in point:
            out += [f"{point[f'{name}_tflops']:.0f}", ms(point.get(f"{name}_first_call_ms"))]
        else:
            out += [MISSING] * 2
    return out
