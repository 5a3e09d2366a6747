"""Transport probe (``transport_probe``): the side communicator's collectives moving one layer's
state alone and beside a matmul loop, with NCCL's kernels (``sm``) and with copy engines
(``ce``: the zero-CTA policy between buffers in symmetric memory); ``bench/transport_probe.py``."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import ms, table


def render(result: Result, _ctx: Context) -> list[str]:
    lines = ["Per transport and collective (slowest rank, p50): its time alone; its time per call when "
             "repeated beside a loop of bf16 matmuls on the compute stream; how much longer that loop took "
             "(the processors and memory the transfer took from it); and the device work the profiler saw "
             "for one call (`Memcpy`: copy engines only).", ""]
    rows = []
    for r in result["summary"]["rows"]:
        if "error" in r:
            rows.append([r.get("transport", "-"), r.get("op", "-"), "-", "-", "-", r["error"]])
            continue
        rows.append([r["transport"], r["op"], ms(r["alone_ms"]), ms(r["collectives_beside_ms"] / r["repeat"]),
                     f"{r['matmul_slowdown_pct']:.1f}%", "; ".join(k.split("(")[0].strip() for k in r["kernels"])])
    return lines + table(["transport", "collective", "alone ms", "beside matmuls ms", "matmul loop slower",
                          "device work"], rows, "llrrrl") + [""]
