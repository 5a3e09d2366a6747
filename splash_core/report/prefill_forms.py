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
    return [f"{result.data.get('notes', '')}", ""] + table(
        ["prefill form", "tokens/s", f"over {samples[0]['form']}", "prefill steps", "in prefill", "prefill step p50",
         "decode step p50", "run", "steps booked"], rows, "lrrrrrrrl") + [""]


def booked(counts: dict | None) -> str:
    """``754 ahead`` / ``754 sync``: how rank 0 booked the run's steps (older files: not recorded)."""
    return ", ".join(f"{v} {k}" for k, v in sorted((counts or {}).items())) or "not recorded"
