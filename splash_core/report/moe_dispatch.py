"""One MoE layer reaching its experts by all-reduce and by all-to-all (``moe_dispatch``): per step row
count both paths' times beside their floors measured in the same run, which was faster, and what the
hardware profile's ``moe_dispatch: cheaper`` rule picks."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import ms, sig, table


def render(result: Result, ctx: Context) -> list[str]:
    summary = result["summary"]
    r = summary["rates"]
    lines = [f"T = {result['T']}. Rates measured in the same run: all-gather {sig(r['all_gather_gbps'])}, all-to-all "
             f"{sig(r['all_to_all_gbps'])}, all-reduce {sig(r['all_reduce_gbps'])} GB/s per rank, latency "
             f"{sig(r['collective_latency_us'])} us; matmul {sig(r['matmul_tflops'])} TFLOP/s, copy "
             f"{sig(r['copy_gbps'])} GB/s.", ""]
    rows = [[f"{p['rows']:,}", ms(p["all_reduce_ms"]), f"{p['all_reduce_over_floor']:.2f}x", ms(p["all_to_all_ms"]),
             f"{p['all_to_all_over_floor']:.2f}x", p["faster"].replace("_", "-"),
             "all-to-all" if p["rule_dispatches"] else "all-reduce", "; ".join(p["mismatch"]) or "within tolerance"]
            for p in summary["points"]]
    return lines + table(["rows", "all-reduce ms", "over floor", "all-to-all ms", "over floor", "faster",
                          f"{summary['hardware_rule']} rule", "outputs"], rows, "rrrrrlll") + [""]
