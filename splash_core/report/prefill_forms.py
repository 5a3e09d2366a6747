"""Prefill forms (``prefill_forms``, ``bench/prefill_forms.py``): one rollout served with prefill
attending absorbed and with the per-request choice of form (:mod:`splash_core.attention_forms`)."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import ms, table


def render(result: Result, _ctx: Context) -> list[str]:
    samples = result["samples"]
    first = samples[0]["tokens_per_s"] or 1.0
    rows = [[s["form"], f"{s['tokens_per_s']:,.0f}", f"{s['tokens_per_s'] / first:.2f}x", str(s["prefill_steps"]),
             f"{s['prefill_s']:.1f} s", ms(s["prefill_step_p50_ms"]), ms(s["decode_step_p50_ms"]),
             f"{s['elapsed_s']:.1f} s"] for s in samples]
    return [f"{result.data.get('notes', '')}", ""] + table(
        ["prefill form", "tokens/s", f"over {samples[0]['form']}", "prefill steps", "in prefill", "prefill step p50",
         "decode step p50", "run"], rows, "lrrrrrrr") + [""]
