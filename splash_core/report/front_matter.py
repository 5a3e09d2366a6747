"""The parts of the report before its chapters: the title and how it was rendered, how to read
its labels, the overview table of every section on every platform, the one list of what each
platform has not measured, and the results no section renders yet."""

from __future__ import annotations

from ..results import Result
from .chapter import missing
from .markdown import table
from .platforms import title
from .sections import SECTIONS


def title_lines(results_note: str) -> list[str]:
    return ["# SPLASH benchmark report", "", f"Rendered from committed files alone: {results_note}", ""]


def how_to_read() -> list[str]:
    return [
        "## How to read this report",
        "",
        "Every block says where its numbers come from:",
        "",
        "- **paper** — copied from the SPLASH paper (B200, H200, DCU), with the table or figure cited;",
        "  the paper's deployments (models, T = 8, SGLang) differ from ours.",
        "- **measured** — measured by this project, with platform, machine, backend, model, T, dtype,",
        "  date, commit, command and file. T is the group size, the ranks that switch together",
        "  (T = 1: a single-device kernel benchmark).",
        "- **model** — computed by SPLASH's cost model; a prediction, not a measurement.",
        "",
        "DP denotes DP-attention throughout.",
        "",
        "The overview and every chapter and section name the source of their numbers, with T and the",
        "machine.",
        "",
        "Paper and measured numbers never share a table or a plot; predicted crossovers are compared",
        "with sweeps of the same source (the paper's with the paper's, the cost model's with ours). The",
        "cost model's predictions of the paper's fixed-layout sweeps (`splash sweep --paper`) stand",
        "beside the paper's Tables 4-6, labelled model, to show how far the model reproduces them.",
        "",
    ]


def overview(status: dict, order: list[str]) -> list[str]:
    """One row per section, one cell per platform: the labels of its blocks, or 'not measured'."""
    rows = [[section.label] + [", ".join(dict.fromkeys(status[k][section.benchmark])) or "not measured" for k in order]
            for section in SECTIONS]
    return ["## Overview", ""] + table(["section", *(title(k) for k in order)], rows, "l" * (len(order) + 1)) + [""]


def not_measured(status: dict, order: list[str], results_root: str) -> list[str]:
    """Per platform, the sections without its own kind of numbers, in one list (a chapter leaves
    them out, or shows only the paper's or the model's blocks for them)."""
    lines = ["## Not measured", "",
             "Sections a platform has no numbers of its own for (measured ones; the model's, for the sections "
             "the cost model produces): its chapter leaves them out, or shows only the paper's or the model's "
             "blocks for them (named in parentheses).", ""]
    for key in order:
        kinds = [(kind, _lacking(status[key], kind)) for kind in ("measured", "model")]
        if not any(lacking for _, lacking in kinds):
            continue
        lines.append(f"- **{title(key)}** — no result of these benchmarks under `{results_root}/{key}*/`:")
        lines += [f"  - {MISSING_KIND[kind]}: {_names(lacking)}." for kind, lacking in kinds if lacking]
    return lines + [""]


MISSING_KIND = {"measured": "not measured on this platform", "model": "no cost-model prediction for this platform"}


def _lacking(platform_status: dict, kind: str) -> list[tuple]:
    """(section, labels of the blocks it still shows) for the sections of ``kind`` this platform lacks."""
    return [(s, platform_status[s.benchmark]) for s in SECTIONS
            if s.produced_by == kind and missing(s, platform_status[s.benchmark])]


def _names(lacking: list[tuple]) -> str:
    return "; ".join(_named(s, labels) for s, labels in lacking)


def _named(section, labels: list[str]) -> str:
    """A section's name in the list, with the sources its blocks still show: 'KV capacity per layout (paper)'."""
    shown = list(dict.fromkeys(label.split(" ", 1)[0] for label in labels))
    return section.label + (f" ({', '.join(shown)})" if shown else "")


def unrendered(results: list[Result]) -> list[str]:
    if not results:
        return []
    rows = [[r.data["benchmark"], r.platform, r.data["source"], f"`{r.path}`"] for r in results]
    return (["## Results without a renderer", "",
             "These files are valid results of benchmarks the report has no section for yet:", ""]
            + table(["benchmark", "platform", "source", "file"], rows, "llll") + [""])
