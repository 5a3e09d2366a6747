"""A decode step eager against replayed from its captured graph (``decode_step``): per batch
size and context, the wall times of both paths, the replay's device time alone, the roofline
measured in the same run, and the capture's cost, with the ratios issue 22's targets name."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import MISSING, ms, sig, table, tokens

MIB = float(1 << 20)


def render(result: Result, ctx: Context) -> list[str]:
    summary = result["summary"]
    rates = summary["rates"]
    lines = [f"T = 1, one layout; the ceilings measured in the same run: copy {sig(rates['copy_gbps'])} GB/s "
             f"(read + written), matmul {sig(rates['matmul_tflops'])} TFLOP/s. Wall: host start to device done; "
             "replay: the captured graph's device time alone; roofline: (weights + KV) bytes at the copy rate or "
             "FLOPs at the matmul rate, whichever is longer.", ""]
    rows = [_row(p) for p in summary["points"]]
    lines += table(["B", "context", "layers", "eager ms", "unfused ms", "graph ms", "replay ms", "roofline ms",
                    "wall / replay", "eager / graph", "capture s", "graph MiB", "same tokens"], rows,
                   "rrrrrrrrrrrrl") + [""]
    failed = sorted({p["failed"] for p in summary["points"] if p.get("failed")})
    if failed:
        lines += [f"Captures that failed (those steps ran eagerly): {'; '.join(failed)}.", ""]
    if summary["skipped"]:
        lines += [f"Skipped (time budget): {', '.join(summary['skipped'])}.", ""]
    profiled = [p for p in summary["points"] if p.get("profile", {}).get("classes")]
    if profiled:
        lines += _profile_table(profiled)
    return lines


PROFILED = ("attention", "gemm", "lm_head", "routing_topk", "elementwise", "memcpy", "collective", "other")


def _profile_table(points: list[dict]) -> list[str]:
    """Where a replayed step's device time goes: each kernel class's share of the step's span (and, where
    its bytes or FLOPs are known, its time over its own floor), the idle gaps, the time outside the span."""
    rows = []
    for p in points:
        prof = p["profile"]
        cells = []
        for name in PROFILED:
            c = prof["classes"].get(name, {})
            over = f" ({c['over_floor']:.2f}x)" if c.get("over_floor") else ""
            cells.append(f"{c.get('share', 0):.0%}{over}" if c.get("kernels") else "")
        rows.append([str(p["batch"]), tokens(p["context"]), prof.get("profiled", "graph"), *cells,
                     f"{prof['idle_share']:.0%}", ms(prof.get("outside_span_us", 0) / 1e3)])
    return ["Profiled replays (bench/splash_bench/kernel_classes.py): each kernel class's share of the step's "
            "kernel span, and in brackets its time over its own floor (its bytes at the copy rate or FLOPs at the "
            "matmul rate).", ""] + table(["B", "context", "profiled", *PROFILED, "idle", "outside span ms"], rows,
                                         "rrl" + "r" * (len(PROFILED) + 2)) + [""]


def _row(p: dict) -> list[str]:
    """One point: times of both paths, the roofline, the ratios, the capture's cost and the tokens' check."""
    captured = "" if p["captured"] else " (eager)"
    return [str(p["batch"]), tokens(p["context"]), str(p["layers"]), ms(p["eager_ms"]),
            ms(p.get("eager_unfused_ms")) if "eager_unfused_ms" in p else MISSING,
            ms(p["graph_ms"]) + captured, ms(p.get("replay_ms")), ms(p["roofline_ms"]),
            f"{p['wall_over_replay']:.2f}" if "wall_over_replay" in p else MISSING,
            f"{p['eager_over_graph']:.1f}x", f"{p['capture_s']:.2f}" if "capture_s" in p else MISSING,
            f"{p['graph_bytes'] / MIB:.0f}" if "graph_bytes" in p else MISSING, _same_tokens(p)]


def _same_tokens(p: dict) -> str:
    if p["tokens_match"]:
        return "yes"
    return "near ties only" if not p["decisive_mismatches"] else f"**{p['decisive_mismatches']} differ**"
