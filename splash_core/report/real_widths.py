"""Real widths (``real_widths``, ``bench/real_widths.py``): a random-init checkpoint with
DeepSeek-V3's real widths written, loaded and served on one device as a user would run it."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import ms, table, tokens

GIB = float(1 << 30)


def render(result: Result, _ctx: Context) -> list[str]:
    s = result["summary"]
    w, load = s["written"], s["load"]
    written = (f"{w['bytes'] / 1e9:.1f} GB reused from a kept run" if w.get("reused") else
               f"{w['bytes'] / 1e9:.1f} GB written at {w['gb_per_s']:.2f} GB/s")
    held = "; feed-forward weights kept FP8 as stored" if s.get("ffn_weights") == "fp8" else ""
    cache = "dropped" if w.get("page_cache_dropped") else "kept"
    lines = [f"{s['layers']} layers ({s['dense_layers']} dense, the rest routed experts at DeepSeek-V3's widths), "
             f"B = {s['batch']}. Checkpoint: {written}; loaded by `splash generate` in {load['seconds']:.1f} s "
             f"({load['gb_per_s']:.2f} GB/s from disk, page cache {cache}): "
             f"{load['format']}{held}.", ""]
    mem = s.get("memory_bytes", {})
    if mem:
        lines += table(["part", "GiB per rank"], [[k, f"{v / GIB:.2f}"] for k, v in mem.items() if v], "lr") + [""]
    rows = [[tokens(r["context"]), str(r["output_tokens"]), _beside(r, "prefill"), str(r["prefill_rows"]),
             _beside(r, "decode"), f"{r['tokens_per_s']:,.0f}", f"{r['load_s']:.1f} s"] for r in s["runs"]]
    lines += table(["context", "output tokens", "prefill step p50 ms (roofline)", "prefill rows",
                    "decode step p50 ms (roofline)", "tokens/s", "load (splash run)"], rows, "rrrrrrr") + [""]
    for skipped in s.get("skipped", []):
        lines += [f"Not run: {tokens(skipped['context'])} context ({skipped['why']}).", ""]
    return lines


def _beside(run: dict, phase: str) -> str:
    """A step's p50 and, where the run computed it, its roofline's p50 and the ratio."""
    step, floor = run[f"{phase}_step_ms_p50"], run.get(f"{phase}_roofline_ms_p50")
    return ms(step) + (f" ({ms(floor)}, {step / floor:.2f}x)" if floor else "")
