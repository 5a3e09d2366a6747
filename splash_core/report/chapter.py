"""One platform's chapter: where its numbers come from, then every section that has a block
on this platform, each result in its own labelled block. Sections with nothing here are left
out and named once in the report's "Not measured" list (:mod:`.front_matter`)."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import block_intro, device, source_label
from .platforms import title
from .sections import SECTIONS, Section

NOT_MEASURED_ANCHOR = "#not-measured"


def render_chapter(ctx: Context) -> tuple[list[str], dict[str, list[str]]]:
    """The chapter's Markdown and its status: section benchmark -> block labels ([] = none)."""
    status = {s.benchmark: [source_label(r) for r in _blocks(ctx, s)] for s in SECTIONS}
    lines = [f"## {title(ctx.platform)}", ""] + _sources(ctx.results) + _not_measured_pointer(status)
    group = ""
    for section in SECTIONS:
        blocks = _blocks(ctx, section)
        if not blocks:  # named in the "Not measured" list instead of a stub here
            continue
        if section.group and section.group != group:  # the first part of a grouped section shown here
            parts = {s.benchmark for s in SECTIONS if s.group == section.group}
            lines += [f"### {section.group}", ""] + _numbers([r for r in ctx.results if r.benchmark in parts])
        group = section.group
        lines += _section(section, blocks, ctx)
    return lines, status


def missing(section: Section, labels: list[str]) -> bool:
    """Whether a platform lacks the section's own kind of numbers (measured, or the model's)."""
    return not any(label.split(" ", 1)[0] == section.produced_by for label in labels)


def _blocks(ctx: Context, section: Section) -> list[Result]:
    return [r for r in ctx.results if r.benchmark == section.benchmark]


def _section(section: Section, blocks: list[Result], ctx: Context) -> list[str]:
    """A section's heading (a part's within its group), its paper counterpart and its blocks."""
    lines = [f"#### {section.title}", ""] if section.group else [f"### {section.title}", ""] + _numbers(blocks)
    if section.like:
        lines += [f"Like {section.like}.", ""]
    for r in blocks:
        lines += block_intro(r, 5 if section.group else 4) + section.render(r, ctx)
    return lines


def _numbers(blocks: list[Result]) -> list[str]:
    """The line under a section heading that says where its numbers on this platform come from."""
    if not blocks:
        return []
    labels = list(dict.fromkeys(source_label(r, detail=True) for r in blocks))
    return [f"*Numbers here:* {'; '.join(labels)}.", ""]


def _sources(results: list[Result]) -> list[str]:
    """A chapter's provenance at a glance: each source, results folder, T and machine, with its models."""
    found: dict[tuple, list[str]] = {}
    for r in results:
        d = r.data
        where = "the paper's deployment" if d["source"] == "paper" else r.platform
        models = found.setdefault((d["source"], where, d["T"], device(d["machine"])), [])
        if d["model"] not in models:
            models.append(d["model"])
    if not found:
        return ["Nothing measured, modelled or copied from the paper for this platform yet.", ""]
    lines = ["Where this chapter's numbers come from:", ""]
    for (source, where, T, machine), models in found.items():
        machine = f"one device of {machine}" if T == 1 and source == "measured" else machine
        lines.append(f"- **{source}** — {where}: T = {T}, {machine}; model {', '.join(models)}.")
    return lines + [""]


def _not_measured_pointer(status: dict[str, list[str]]) -> list[str]:
    """One line instead of a stub per section: how many sections lack this platform's own numbers."""
    lacking = [s for s in SECTIONS if missing(s, status[s.benchmark])]
    if not lacking:
        return []
    shown = sum(1 for s in lacking if status[s.benchmark])
    paper_only = f"; {shown} of them show only the paper's or the model's numbers" if shown else ""
    return [f"*Not measured on this platform:* {len(lacking)} of {len(SECTIONS)} sections{paper_only} "
            f"(named under [Not measured]({NOT_MEASURED_ANCHOR})).", ""]
