"""Findings about kernels, steps and checks: decode and prefill against the rooflines measured
in the same runs, SPLASH's decode against FlashMLA's, a decode step from its captured graph,
the cost model against measured step times, and the correctness checks on the device."""

from __future__ import annotations

from ..results import Result
from .findings_format import finding, of_type, origin, percent, span, times
from .markdown import tokens
from .peer_kernels import by_point, splash_over_flashmla

ROOFLINES = (("mla_decode", "achieved_gbps", "copy_gbps", "decode", "copy bandwidth", "context"),
             ("prefill", "achieved_tflops", "matmul_tflops", "prefill", "matmul rate", "input_tokens"))


def rooflines(results: list[Result]) -> list[str]:
    """The best point of each decode and prefill result as a share of its same-run ceiling."""
    items = []
    for benchmark, rate, ceiling_key, what, ceiling_name, x_key in ROOFLINES:
        for r in of_type(results, benchmark):
            s = r["summary"]
            best = max(s["points"], key=lambda p: p[rate], default=None)
            if best is None or s[ceiling_key] <= 0:
                continue
            items.append(f"{origin(r)}: {what} reaches at best {best[rate] / s[ceiling_key]:.0%} of the "
                         f"{ceiling_name} measured in the same run (`{best['kernel']}`, B = {best['batch']}, "
                         f"{tokens(best[x_key])})")
    return finding("Kernels against their rooflines", items)


def peer_kernels(results: list[Result]) -> list[str]:
    """Per peer-kernel result and cache: SPLASH's decode time over FlashMLA's on the same points."""
    items = []
    for r in of_type(results, "peer_kernels"):
        ratios: dict[str, list[float]] = {}
        for (kv, *_), got in sorted(by_point(r["samples"]).items()):
            ratio = splash_over_flashmla(got)
            if ratio is not None:
                ratios.setdefault(kv, []).append(ratio)
        items += [f"{origin(r, file=True)}, {kv} cache: {span(values, times)} over {len(values)} points"
                  for kv, values in ratios.items()]
    return finding("MLA decode: SPLASH's time over FlashMLA's (below 1x: SPLASH faster)", items)


def decode_graphs(results: list[Result]) -> list[str]:
    """Per decode-step result: eager over graph, and the graph's wall time over the roofline."""
    items = []
    for r in of_type(results, "decode_step"):
        points = r["summary"]["points"]
        if points:
            walls = [p["graph_ms"] / p["roofline_ms"] for p in points if p["roofline_ms"] > 0]
            items.append(f"{origin(r)}: eager / graph {span((p['eager_over_graph'] for p in points), times)}; "
                         f"graph wall / roofline {span(walls, times)} over {len(points)} points")
    return finding("A decode step replayed from its captured graph", items)


def cost_model(results: list[Result]) -> list[str]:
    """Per cost-model check: the variant whose picks lose least against the measured fastest."""
    items = []
    for r in of_type(results, "costmodel_check"):
        s = r["summary"]
        best = min(s["variants"], key=lambda v: v["mean_regret_pct"], default=None)
        if best is not None:
            items.append(f"{origin(r)} against measured `{s['measured_file']}`: least regret with "
                         f"'{best['variant']}': held-out mean |error| decode {percent(best['decode_mean_abs_error_pct'])}"
                         f", prefill {percent(best['prefill_mean_abs_error_pct'])}; the layout it picks measured a "
                         f"mean {percent(best['mean_regret_pct'])} slower than the fastest")
    return finding("Cost model vs the runtime's step times", items)


def correctness(results: list[Result]) -> list[str]:
    """Per correctness result: checks passed, layouts within tolerance, conformance suites passed."""
    items = []
    for benchmark, what in (("mla_correctness", "MLA kernel checks"), ("kda_correctness", "KDA kernel checks")):
        items += [f"{origin(r)}: {r['summary']['checks'] - r['summary']['failed']}/{r['summary']['checks']} "
                  f"{what} passed" for r in of_type(results, benchmark)]
    for r in of_type(results, "runtime_equivalence"):
        failed = r["summary"]["failed"]
        items.append(f"{origin(r)}: runtime per layout vs a float32 reference: "
                     + (f"failed in {', '.join(failed)}" if failed else "every layout passed"))
    for r in of_type(results, "conformance"):
        verdicts = r["summary"]
        items.append(f"{origin(r)}: conformance suite passed on {sum(map(bool, verdicts.values()))}/{len(verdicts)} "
                     "backends")
    return finding("Correctness on the device", items)
