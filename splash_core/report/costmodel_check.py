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
    fitted = {(o["variant"], o["layout"]): o["layer_overhead_us"] for o in summary["overheads"]}
    with_host = [n for n in names if any(v == n for v, _ in fitted)]
    lines += ["Fitted host time per layer (µs):", ""]
    lines += table(["variant", *LAYOUTS], [[n, *(fixed(fitted[(n, l)], 0) if (n, l) in fitted else MISSING
                                                 for l in LAYOUTS)] for n in with_host], "l" + "r" * len(LAYOUTS))
    by_point: dict[tuple, dict] = {}
    for p in summary["points"]:
        by_point.setdefault((PHASES.index(p["phase"]), p["context"], LAYOUTS.index(p["layout"])), {})[p["variant"]] = p
    rows = []
    for (phase, context, layout), per in sorted(by_point.items()):
        first = next(iter(per.values()))
        cells = [f"{ms(per[n]['predicted_ms'])} ({per[n]['error_pct']:+.0f}%)" if n in per else MISSING for n in names]
        rows.append([PHASES[phase], f"{context:,}", LAYOUTS[layout], first["role"], ms(first["measured_ms"]), *cells])
    lines += ["", "Step time in ms, predicted (error against measured):", ""]
    lines += table(["phase", "context", "layout", "role", "measured", *names], rows, "lrll" + "r" * (len(names) + 1))
    return lines + [""]
