"""The cost model's step times beside the runtime's (``costmodel_check``): per variant of the
host term, the errors on held-out points and the regret of the layout it would pick; the
fitted host overheads; and every point, measured beside predicted."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import MISSING, fixed, ms, table

LAYOUTS = ("TP", "CP", "DP", "DOP")
PHASES = ("decode", "prefill")


def render(result: Result, _ctx: Context) -> list[str]:
    summary = result["summary"]
    variants = summary["variants"]
    names = [v["variant"] for v in variants]
    lines = [f"Predicted with hardware profile `{summary['hardware']}` (t0 = {ms(summary['step_overhead_us'] / 1e3)} ms), "
             f"{summary['layers']} layers, against `{summary['measured_file']}`. {summary['fit']}; every other point "
             "is held out. Regret: how much slower the layout the model picks measured than the measured fastest.", ""]
    rows = [[v["variant"], MISSING if "host_overlap" not in v else fixed(v["host_overlap"], 2),
             f"{fixed(v['decode_mean_abs_error_pct'], 1)} / {fixed(v['decode_max_abs_error_pct'], 1)}",
             f"{fixed(v['prefill_mean_abs_error_pct'], 1)} / {fixed(v['prefill_max_abs_error_pct'], 1)}",
             f"{fixed(v['mean_regret_pct'], 1)} / {fixed(v['max_regret_pct'], 1)} ({v['cases']})"] for v in variants]
    lines += table(["variant", "η_h", "decode abs. error % mean / max", "prefill abs. error % mean / max",
                    "regret % mean / max (cases)"], rows, "lrrrr") + [""]
    if summary.get("by_layout"):
        cell = {(r["variant"], r["layout"], r["phase"]): r["mean_abs_error_pct"] for r in summary["by_layout"]}
        target = f" (target: {fixed(summary['target_pct'], 0)}%)" if "target_pct" in summary else ""
        lines += [f"Held-out mean absolute error % per layout, decode / prefill{target}:", ""]
        lines += table(["variant", *LAYOUTS], [[n, *(" / ".join(fixed(cell[(n, l, ph)], 1) if (n, l, ph) in cell
                                                                else MISSING for ph in PHASES) for l in LAYOUTS)]
                                               for n in names], "l" + "r" * len(LAYOUTS)) + [""]
    fitted = {(o["variant"], o["layout"]): o for o in summary["overheads"]}
    with_host = [n for n in names if any(v == n for v, _ in fitted)]
    lines += ["Host time per layer of eagerly run steps (µs; replayed decode steps' time per layer beyond Eq 10 "
              "after the slash, where fitted):", ""]

    def overhead(o: dict) -> str:
        eager = fixed(o["layer_overhead_us"], 0)
        return eager if "graph_layer_overhead_us" not in o else f"{eager} / {fixed(o['graph_layer_overhead_us'], 0)}"

    lines += table(["variant", *LAYOUTS], [[n, *(overhead(fitted[(n, l)]) if (n, l) in fitted else MISSING
                                                 for l in LAYOUTS)] for n in with_host], "l" + "r" * len(LAYOUTS))
    by_point: dict[tuple, dict] = {}
    for p in summary["points"]:
        key = (PHASES.index(p["phase"]), p.get("batch", 0), p["context"], LAYOUTS.index(p["layout"]))
        by_point.setdefault(key, {})[p["variant"]] = p
    rows = []
    for (phase, batch, context, layout), per in sorted(by_point.items()):
        first = next(iter(per.values()))
        cells = [f"{ms(per[n]['predicted_ms'])} ({per[n]['error_pct']:+.0f}%)" if n in per else MISSING for n in names]
        rows.append([PHASES[phase], str(batch) if batch else MISSING, f"{context:,}", LAYOUTS[layout],
                     first.get("path", MISSING), first["role"], ms(first["measured_ms"]), *cells])
    lines += ["", "Step time in ms, predicted (error against measured):", ""]
    lines += table(["phase", "batch", "context", "layout", "path", "role", "measured", *names], rows,
                   "lrrlll" + "r" * (len(names) + 1))
    return lines + [""]
