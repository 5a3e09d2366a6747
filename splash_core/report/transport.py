"""Transport probe (``transport_probe``): the side communicator's collectives moving one layer's
state alone and beside a matmul loop, with the collective library's kernels (``sm``) and with
copy engines (``ce``: a zero-processor policy between buffers in registered memory); ``bench/transport_probe.py``.
Copy interference (``copy_interference``): a step's slowdown beside one layer's page copies per
layer, by the kernels of the collective path or by memcpy as pulls make them;
``bench/copy_interference.py``."""

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


def render_copies(result: Result, _ctx: Context) -> list[str]:
    s = result["summary"]
    lines = [f"Workload: {s['workload']}. Per copy kind and MiB of pages per layer (p50 over interleaved runs, "
             "milliseconds): the step alone and with the copies beside every layer, the slowdown (also per GiB "
             "of pages moved over the step), and one layer's copies alone on an idle device. kernels: the pack "
             "and unpack kernels of the collective path (2 reads and 2 writes per byte); memcpy and pull: one "
             "copy per run of pages (1 read and 1 write), by torch and through the backend's peer memory; "
             "pull_pitched: every other page, one pitched copy per request; spin: no copies, one-thread "
             "kernels that spin beside each layer (a processor held doing nothing, as by a collective "
             "waiting for a peer).", ""]
    ran = result.data.get("ran") or {}
    rows = [[r["variant"], "-" if r["variant"] == "spin" else f"{r['mib_per_layer']:g}", ms(r["step_alone_ms"]), ms(r["step_ms"]), ms(r["slowdown_ms"]),
             f"{r['slowdown_pct']:.2f}%", f"{r['slowdown_ms_per_gib']:.3f}", ms(r["copy_alone_ms"]),
             "; ".join(n.split("(")[0].strip() for n in ran.get(r["variant"], [])) or "-"]
            for r in s["rows"]]
    lines += table(["copies", "MiB per layer", "step alone", "step beside", "slower", "slower %", "ms per GiB",
                    "copy alone", "device work"], rows, "lrrrrrrrl") + [""]
    lengths = result.data.get("run_lengths") or []
    if not lengths:
        return lines
    rows = [["pitched" if r.get("pitched") else "consecutive", str(r["run_pages"]), f"{r['run_bytes'] / 1024:.0f}", str(r["copies"]), ms(r["device_ms"]),
             f"{r['bytes'] / max(r['device_ms'], 1e-9) / 1e6:.0f}", ms(r["host_ms"])] for r in lengths]
    return lines + ["One layer's pages pulled alone through the backend's peer memory, in copies of a given "
                    "number of pages each, consecutive pages or every other page in pitched copies (p50, "
                    "milliseconds): where copies are short the host's calls, not the copy engines, set the time.",
                    ""] + table(["source pages", "pages per copy", "KiB per copy", "copies", "device ms", "GB/s",
                                 "host ms"], rows, "lrrrrrr") + [""]
