"""The findings at the top of the report: what was measured, against what, and the headline
ratios its sections compute (:mod:`.findings_layouts`, :mod:`.findings_kernels`), each number
labelled measured here, taken from the paper, or the cost model's. Nothing here is typed in:
every number comes from the results the report reads."""

from __future__ import annotations

from ..results import Result
from . import findings_kernels, findings_layouts
from .platforms import chapter_order, family, title

FINDINGS = (findings_layouts.sweeps_vs_paper, findings_layouts.switch_overhead, findings_layouts.serving,
            findings_kernels.rooflines, findings_kernels.peer_kernels, findings_kernels.decode_graphs,
            findings_kernels.cost_model, findings_kernels.correctness)
# What a measurement is held against, by the benchmarks that make the comparison.
BASELINES = ((("mla_decode", "prefill", "decode_step"), "the copy bandwidth and matmul rate measured in the same runs"),
             (("peer_kernels",), "FlashMLA and SGLang's decode kernels on the same caches"),
             (("mla_correctness", "kda_correctness", "runtime_equivalence"), "torch and float32 references"),
             (("rollout_serving", "fixed_layout_sweep"), "each fixed layout run on the same workload"))


def render(results: list[Result]) -> list[str]:
    """The "Findings" section: its scope, then one bullet per headline with an item per source."""
    headlines = [line for headline in FINDINGS for line in headline(results)]
    return (["## Findings", ""] + scope(results) + ["", "Headline numbers (details in each platform's chapter):", ""]
            + (headlines or ["- Nothing measured or modelled to compare yet."]) + [""])


def scope(results: list[Result]) -> list[str]:
    """What was measured (results folders with their group sizes T) and what it is held against."""
    return [f"- **Measured here:** {_measured(results)}.", f"- **Against:** {_against(results)}."]


def _measured(results: list[Result]) -> str:
    folders: dict[str, list] = {}
    for r in results:
        if r.data["source"] == "measured":
            folders.setdefault(r.platform, []).append(r.data["T"])
    if not folders:
        return "nothing yet"
    return "; ".join(f"{folder} ({len(ts)} results, T = {', '.join(map(str, sorted(set(ts))))})"
                     for folder, ts in sorted(folders.items()))


def _against(results: list[Result]) -> str:
    chapters = {family(r.platform) for r in results if r.data["source"] == "paper"}
    paper = [title(key) for key in chapter_order(chapters) if key in chapters]
    models = sorted({r.platform for r in results if r.data["source"] == "model"})
    benchmarks = {r.benchmark for r in results if r.data["source"] == "measured"}
    against = [f"the paper's numbers for {', '.join(paper)} (taken from the paper)"] if paper else []
    against += [what for kinds, what in BASELINES if benchmarks & set(kinds)]
    if models:
        against.append(f"SPLASH's cost model (predictions for {', '.join(models)}, labelled cost model)")
    return "; ".join(against) or "nothing yet"
