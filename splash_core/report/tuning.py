"""Kernel tuning: the attention tile sweep (``mla_kernel_sweep``: per workload the winning tile,
the previous kernel's tile, the speed-up and the rates at each point) and the device ceilings
measured beside it (``gpu_rates``: copy bandwidth and matmul rate), which the decode and
prefill sections draw as their rooflines."""

from __future__ import annotations

import re

from ..results import Result
from .context import Context
from .markdown import MISSING, ms, sig, table, tokens

# Which roofline each ceiling is, and the sections (benchmark -> summary key) that draw it.
CEILINGS = (("copy_gbps", "memory copy (bytes read + written per second)", "GB/s", "mla_decode"),
            ("matmul_tflops", "dense matmul in the result's dtype", "TFLOP/s", "prefill"))


def _rate(rates: dict, unit: str) -> float | None:
    """The first rate of ``unit`` ('gbps' or 'tflops') in one point's rates."""
    return next((v for k, v in rates.items() if k.endswith(unit)), None)


def _ceilings(result: Result, ctx: Context) -> dict | None:
    """The device ceilings measured by the same command in the same results folder, if any."""
    return next((r["summary"] for r in ctx.results if r.benchmark == "gpu_rates" and r.platform == result.platform
                 and r.data["command"] == result.data["command"]), None)


def _point(workload: str, point: list[int]) -> str:
    a, context = point
    return f"{a:,} rows, {tokens(context)}" if workload.startswith("extend") else f"B {a}, {tokens(context)}"


def _previous(result: Result, workload: str) -> str:
    """The previous kernel's tile on this workload, from the samples: 'r1h16k64w8s2p2 (8c08fbc)'."""
    for s in result["samples"]:
        if s["workload"] == workload and s["kernel"].startswith("previous"):
            origin = re.search(r"\((.+)\)", s["kernel"])
            return f"`{s['tile']}`" + (f" ({origin[1]})" if origin else "")
    return MISSING


def _share(value: float | None, ceiling: float | None) -> str:
    if value is None:
        return MISSING
    return sig(value) + (f" ({value / ceiling:.0%})" if ceiling else "")


def render_sweep(result: Result, ctx: Context) -> list[str]:
    """Per workload the winning tile and speed-up, then the times and rates at every point."""
    summary = result["summary"]
    ceilings = _ceilings(result, ctx) or {}
    chosen = ", ".join(f"{entry} `{tile}`" for entry, tile in summary["tiles"].items())
    lines = [f"Tiles chosen: {chosen}. Per workload, the correct candidate with the lowest mean time relative to "
             "the fastest at each point wins; where the sweep ran the previous kernel too, it ran the same points in "
             "the same run.", ""]
    overview = [_overview_row(result, name, w) for name, w in summary["workloads"].items()]
    lines += table(["workload", "heads", "candidates", "winner", "previous kernel", "speed-up"], overview,
                   "lrllll") + [""]
    shares = (" In parentheses: the share of the copy bandwidth (GB/s) and of the matmul rate (TFLOP/s) measured "
              "by the same command (see the device ceilings below)." if ceilings else "")
    lines += [f"Per point: milliseconds and rates of the winner and of the previous kernel.{shares}", ""]
    rows = [row for name, w in summary["workloads"].items() for row in _point_rows(name, w, ceilings)]
    headers = ["workload", "point", "winner ms", "GB/s", "TFLOP/s", "previous ms", "GB/s", "TFLOP/s", "speed-up"]
    return lines + table(headers, rows, "ll" + "r" * 7) + [""]


def _overview_row(result: Result, name: str, w: dict) -> list[str]:
    speedups = w.get("speedup_vs_previous", [])
    span = (f"{min(speedups):.2f}x – {max(speedups):.2f}x" if len(speedups) > 1 else
            f"{speedups[0]:.2f}x" if speedups else MISSING)
    return [name, str(w["heads"]), f"{w['candidates']} ({w['failed']} failed, {w['skipped']} skipped)",
            f"`{w['winner']}`" if "winner" in w else "none", _previous(result, name), span]


def _point_rows(name: str, w: dict, ceilings: dict) -> list[list[str]]:
    copy, matmul = ceilings.get("copy_gbps"), ceilings.get("matmul_tflops")
    rows = []
    for i, point in enumerate(w["points"]):
        win = w["winner_rates"][i] if "winner_rates" in w else {}
        old = w["previous_rates"][i] if "previous_rates" in w else {}
        rows.append([name, _point(name, point),
                     ms(w["winner_ms"][i]) if "winner_ms" in w else MISSING,
                     _share(_rate(win, "gbps"), copy), _share(_rate(win, "tflops"), matmul),
                     ms(w["previous_ms"][i]) if "previous_ms" in w else MISSING,
                     _share(_rate(old, "gbps"), copy), _share(_rate(old, "tflops"), matmul),
                     f"{w['speedup_vs_previous'][i]:.2f}x" if "speedup_vs_previous" in w else MISSING])
    return rows


def render_rates(result: Result, ctx: Context) -> list[str]:
    summary = result["summary"]
    rows = []
    for key, what, unit, user in CEILINGS:
        drawn = []
        for r in ctx.results:
            if r.benchmark == user and r.platform == result.platform and key in r["summary"]:
                own = r["summary"][key]
                same = "same value" if own == summary[key] else f"its own run: {sig(own)} {unit}"
                drawn.append(f"`{r.path}` ({same})")
        rows.append([what, f"{sig(summary[key])} {unit}", ", ".join(drawn) or "no result of this folder"])
    lines = [f"Measured once per run of `{result.data['command']}`; the kernel sections draw them as rooflines.", ""]
    return lines + table(["ceiling", "measured", "drawn as the roofline of"], rows, "lrl") + [""]

