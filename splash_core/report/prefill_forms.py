"""Prefill forms (``prefill_forms``, ``bench/prefill_forms.py``): one rollout served with prefill
attending absorbed and with the per-request choice of form (:mod:`splash_core.planning.attention_forms`), or
with and without the host planning the next step while the device runs one (form ``<form>/no-overlap``)."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import ms, table


def render(result: Result, _ctx: Context) -> list[str]:
    samples = result["samples"]
    first = samples[0]["tokens_per_s"] or 1.0
    rows = [[s["form"], f"{s['tokens_per_s']:,.0f}", f"{s['tokens_per_s'] / first:.2f}x", str(s["prefill_steps"]),
             f"{s['prefill_s']:.1f} s", ms(s["prefill_step_p50_ms"]), ms(s["decode_step_p50_ms"]),
             f"{s['elapsed_s']:.1f} s", booked(s.get("booked"))] for s in samples]
    lines = table(["prefill form", "tokens/s", f"over {samples[0]['form']}", "prefill steps", "in prefill",
                   "prefill step p50", "decode step p50", "run", "steps booked"], rows, "lrrrrrrrl") + [""]
    limits = [_limit(s) for s in samples if s.get("physical_limit_s")]
    if limits:
        rates = result["summary"]["rates"]
        lines += [f"The run's physical limit (its own FLOPs at the matmul rate, {rates['matmul_tflops']:.0f} TFLOP/s, "
                  f"and decode bytes at the copy rate, {rates['copy_gbps']:,.0f} GB/s, both measured in the run): "
                  + "; ".join(limits) + ".", ""]
    return lines


def _limit(sample: dict) -> str:
    """``auto: 31.7 s of 53.9 s measured (59%; prefill 20.7 of 38.9 s, decode 11.0 of 15.0 s)``."""
    parts = ", ".join(f"{name} {p['limit_s']:.1f} of {p['measured_s']:.1f} s"
                      for name, p in sample.get("parts", {}).items())
    estimated = "" if sample.get("schedule_matches", True) else ", estimated: the replayed schedule differs"
    return (f"{sample['form']}: {sample['physical_limit_s']:.1f} s of {sample['measured_s']:.1f} s measured "
            f"({sample['ratio']:.0%}; {parts}{estimated})")


def booked(counts: dict | None) -> str:
    """``754 ahead`` / ``754 sync``: how rank 0 booked the run's steps (older files: not recorded)."""
    return ", ".join(f"{v} {k}" for k, v in sorted((counts or {}).items())) or "not recorded"
