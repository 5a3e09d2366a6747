"""Assemble the report: one chapter per platform, every section in every chapter, each
result in its own labelled block, and a plain "not measured on this platform" where a
platform has nothing for a section. The overview, each chapter and each section with numbers
say where they come from: paper, measured or model, with the group size T and the machine."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..results import Result
from .context import Context
from .markdown import block_intro, device, source_label, table
from .sections import BY_BENCHMARK, SECTIONS

# Platforms always shown (the paper's three and the CPU we measure on), in this order;
# result folders of other platforms follow alphabetically.
PLATFORMS = {"b200": "B200", "h200": "H200", "dcu": "DCU (BW1000)", "cpu": "CPU (reference backend)"}
SOURCE_ORDER = {"paper": 0, "measured": 1, "model": 2}


def family(platform: str) -> str:
    """Results folder -> chapter: 'h200x8' and 'h200' both belong to H200."""
    match = re.fullmatch(r"(.+?)x\d+", platform)
    return match[1] if match else platform


@dataclasses.dataclass(frozen=True)
class Report:
    markdown: str
    images: tuple[str, ...]
    status: dict  # platform -> section benchmark -> list of block labels ([] = not measured)
    unrendered: tuple[str, ...]  # files of benchmarks without a renderer


def build(results: list[Result], out: Path, results_root: str, results_note: str) -> Report:
    """Render ``results`` (paper and ours together) into Markdown, writing plots into ``out``;
    ``results_root`` names the measurements folder in "not measured" lines."""
    chapters: dict[str, list[Result]] = {key: [] for key in PLATFORMS}
    for r in results:
        chapters.setdefault(family(r.platform), []).append(r)
    order = list(PLATFORMS) + sorted(k for k in chapters if k not in PLATFORMS)
    status: dict[str, dict[str, list[str]]] = {}
    body: list[str] = []
    images: list[str] = []
    for key in order:
        ctx = Context(out, key, sorted(chapters[key], key=_block_order))
        status[key] = {}
        body += [f"## {PLATFORMS.get(key, key.upper())}", ""] + _chapter_sources(ctx.results)
        group = ""
        for section in SECTIONS:
            blocks = [r for r in ctx.results if r.benchmark == section.benchmark]
            status[key][section.benchmark] = [_label(r) for r in blocks]
            if section.group and section.group != group:  # the first part of a grouped section
                parts = {s.benchmark for s in SECTIONS if s.group == section.group}
                body += [f"### {section.group}", ""] + _numbers([r for r in ctx.results if r.benchmark in parts])
            group = section.group
            body += [f"#### {section.title}", ""] if group else ([f"### {section.title}", ""] + _numbers(blocks))
            if section.like:
                body += [f"Like {section.like}.", ""]
            for r in blocks:
                body += block_intro(r, 5 if group else 4) + section.render(r, ctx)
            if not any(r.data["source"] == section.produced_by for r in blocks):
                body += [_missing_line(section.produced_by, f"{results_root}/{key}*/", section.benchmark), ""]
        images += ctx.images
    unrendered = [r for r in results if r.benchmark not in BY_BENCHMARK]
    head = _header(results_note) + _overview(status, order) + _unrendered(unrendered)
    return Report("\n".join(head + body).rstrip() + "\n", tuple(images), status, tuple(r.path for r in unrendered))


def _block_order(r: Result) -> tuple:
    return (SOURCE_ORDER.get(r.data["source"], 9), r.platform, r.path)


def _label(r: Result) -> str:
    return source_label(r)


def _numbers(blocks: list[Result]) -> list[str]:
    """The line under a section heading that says where its numbers on this platform come from."""
    if not blocks:
        return []
    labels = list(dict.fromkeys(source_label(r, detail=True) for r in blocks))
    return [f"*Numbers here:* {'; '.join(labels)}.", ""]


def _chapter_sources(results: list[Result]) -> list[str]:
    """A chapter's provenance at a glance: each source, results folder, T and machine, with its models."""
    found: dict[tuple, list[str]] = {}
    for r in results:
        d = r.data
        where = "the paper's deployment" if d["source"] == "paper" else r.platform
        key = (d["source"], where, d["T"], device(d["machine"]))
        found.setdefault(key, [])
        if d["model"] not in found[key]:
            found[key].append(d["model"])
    if not found:
        return ["Nothing measured, modelled or copied from the paper for this platform yet.", ""]
    lines = ["Where this chapter's numbers come from:", ""]
    for (source, where, T, machine), models in found.items():
        machine = f"one device of {machine}" if T == 1 and source == "measured" else machine
        lines.append(f"- **{source}** — {where}: T = {T}, {machine}; model {', '.join(models)}.")
    return lines + [""]


def _missing_line(produced_by: str, folders: str, benchmark: str) -> str:
    if produced_by == "model":
        return f"**Model:** no cost-model prediction for this platform (no `{benchmark}` result under `{folders}`)."
    return f"**Measured:** not measured on this platform (nothing under `{folders}`)."


def _header(results_note: str) -> list[str]:
    return [
        "# SPLASH benchmark report",
        "",
        f"Rendered from committed files alone: {results_note}",
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


def _overview(status: dict, order: list[str]) -> list[str]:
    rows = []
    for section in SECTIONS:
        rows.append([section.label] + [", ".join(dict.fromkeys(status[k][section.benchmark])) or "not measured"
                                        for k in order])
    return ["## Overview", ""] + table(["section", *(PLATFORMS.get(k, k.upper()) for k in order)], rows,
                                       "l" * (len(order) + 1)) + [""]


def _unrendered(results: list[Result]) -> list[str]:
    if not results:
        return []
    rows = [[r.data["benchmark"], r.platform, r.data["source"], f"`{r.path}`"] for r in results]
    return (["## Results without a renderer", "",
             "These files are valid results of benchmarks the report has no section for yet:", ""]
            + table(["benchmark", "platform", "source", "file"], rows, "llll") + [""])
