"""A workload served end to end by the engine under SPLASH and under each fixed layout
(``bench/engine_bench.py``): throughput per policy and SPLASH over the best fixed layout."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import bold, fixed, rate, table


def render(result: Result, _ctx: Context) -> list[str]:
    summary = result["summary"]
    policies = sorted(summary["policies"], key=lambda r: -r["tokens_per_s"])
    best = max(r["tokens_per_s"] for r in policies)
    rows = [[r["policy"], bold(rate(r["tokens_per_s"])) if r["tokens_per_s"] == best else rate(r["tokens_per_s"]),
             fixed(r["elapsed_s"], 2), f"{r['steps']:,}", str(r["switches"]), str(r["served"]), r["layout_steps"]]
            for r in policies]
    lines = [f"Workload `{summary['workload']}`, {summary['output_tokens']:,} generated tokens per run. "
             f"SPLASH / best fixed layout ({summary['best_fixed']}): "
             f"**{summary['splash_over_best_fixed']:.3f}x**.", ""]
    return lines + table(["policy", "tokens/s", "time s", "steps", "switches", "served", "steps per layout"],
                         rows, "lrrrrrl") + [""]
