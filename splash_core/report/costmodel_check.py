"""The cost model's step times beside the runtime's (``costmodel_check``): per variant of the
host term, the errors on held-out points and the regret of the layout it would pick; the
fitted host overheads; every point, measured beside predicted; and, where run, its sparse
attention's charges against the runtime's counts."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import MISSING, fixed, ms, table

LAYOUTS = ("TP", "CP", "DP", "DOP")
PHASES = ("decode", "prefill")


def render(result: Result, _ctx: Context) -> list[str]:
    """The variants' errors and regret, the per-layout errors, the fitted host time and every point."""
    summary = result["summary"]
    names = [v["variant"] for v in summary["variants"]]
    lines = _intro(summary) + _variants_table(summary["variants"]) + [""]
    lines += _by_layout_table(summary, names)
    lines += _overheads_table(summary["overheads"], names)
    lines += ["", "Step time in ms, predicted (error against measured):", ""]
    return lines + _points_table(summary["points"], names) + [""] + _dsa(summary.get("dsa"))


def _dsa(dsa: dict | None) -> list[str]:
    """The sparse-attention check (``--dsa``): agreement, what was compared, every problem."""
    if dsa is None:
        return []
    verdict = "agrees with" if dsa["passed"] else "disagrees with"
    return [f"Sparse attention ({dsa['model']}, T = {dsa['T']}): the cost model {verdict} the runtime over "
            f"{dsa['steps_compared']} steps on whether decode steps are captured (the model's decode is "
            f"{'' if dsa['decode_capturable'] else 'not '}capturable), where the indexer scores, the pairs attended "
            f"and CP's top-k candidate bytes (not compared on {dsa['cp_history_steps']} CP steps whose prefill rows "
            "it prices as gathering the history).", ""] + [f"- {p}" for p in dsa["problems"]] + \
        [""] * bool(dsa["problems"])


def _intro(summary: dict) -> list[str]:
    return [f"Predicted with hardware profile `{summary['hardware']}` (t0 = {ms(summary['step_overhead_us'] / 1e3)} ms), "
            f"{summary['layers']} layers, against `{summary['measured_file']}`. {summary['fit']}; every other point "
            "is held out. Regret: how much slower the layout the model picks measured than the measured fastest.", ""]


def _mean_max(variant: dict, key: str) -> str:
    return f"{fixed(variant[f'{key}_mean_abs_error_pct'], 1)} / {fixed(variant[f'{key}_max_abs_error_pct'], 1)}"


def _variants_table(variants: list[dict]) -> list[str]:
    rows = [[v["variant"], MISSING if "host_overlap" not in v else fixed(v["host_overlap"], 2),
             _mean_max(v, "decode"), _mean_max(v, "prefill"),
             f"{fixed(v['mean_regret_pct'], 1)} / {fixed(v['max_regret_pct'], 1)} ({v['cases']})"] for v in variants]
    return table(["variant", "η_h", "decode abs. error % mean / max", "prefill abs. error % mean / max",
                  "regret % mean / max (cases)"], rows, "lrrrr")


def _by_layout_table(summary: dict, names: list[str]) -> list[str]:
    if not summary.get("by_layout"):
        return []
    cell = {(r["variant"], r["layout"], r["phase"]): r["mean_abs_error_pct"] for r in summary["by_layout"]}

    def phases(name: str, layout: str) -> str:
        return " / ".join(fixed(cell[(name, layout, ph)], 1) if (name, layout, ph) in cell else MISSING
                          for ph in PHASES)

    target = f" (target: {fixed(summary['target_pct'], 0)}%)" if "target_pct" in summary else ""
    rows = [[n, *(phases(n, layout) for layout in LAYOUTS)] for n in names]
    return ([f"Held-out mean absolute error % per layout, decode / prefill{target}:", ""]
            + table(["variant", *LAYOUTS], rows, "l" + "r" * len(LAYOUTS)) + [""])


def _overheads_table(overheads: list[dict], names: list[str]) -> list[str]:
    fitted = {(o["variant"], o["layout"]): o for o in overheads}
    with_host = [n for n in names if any(v == n for v, _ in fitted)]
    rows = [[n, *(_overhead(fitted[(n, layout)]) if (n, layout) in fitted else MISSING for layout in LAYOUTS)]
            for n in with_host]
    return (["Host time per layer of eagerly run steps (µs; replayed decode steps' time per layer beyond Eq 10 "
             "after the slash, where fitted):", ""] + table(["variant", *LAYOUTS], rows, "l" + "r" * len(LAYOUTS)))


def _overhead(o: dict) -> str:
    eager = fixed(o["layer_overhead_us"], 0)
    return eager if "graph_layer_overhead_us" not in o else f"{eager} / {fixed(o['graph_layer_overhead_us'], 0)}"


def _points_table(points: list[dict], names: list[str]) -> list[str]:
    by_point: dict[tuple, dict] = {}
    for p in points:
        key = (PHASES.index(p["phase"]), p.get("batch", 0), p["context"], LAYOUTS.index(p["layout"]))
        by_point.setdefault(key, {})[p["variant"]] = p
    rows = []
    for (phase, batch, context, layout), per in sorted(by_point.items()):
        first = next(iter(per.values()))
        cells = [f"{ms(per[n]['predicted_ms'])} ({per[n]['error_pct']:+.0f}%)" if n in per else MISSING for n in names]
        rows.append([PHASES[phase], str(batch) if batch else MISSING, f"{context:,}", LAYOUTS[layout],
                     first.get("path", MISSING), first["role"], ms(first["measured_ms"]), *cells])
    return table(["phase", "batch", "context", "layout", "path", "role", "measured", *names], rows,
                 "lrrlll" + "r" * (len(names) + 1))
