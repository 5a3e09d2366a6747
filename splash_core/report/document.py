"""Assemble the report: the findings and the overview first, the one list of what each platform
has not measured, then one chapter per platform (:mod:`.chapter`) with each result in its own
labelled block. The overview, each chapter and each section with numbers say where they come
from: paper, measured or model, with the group size T and the machine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..results import Result
from . import findings
from .chapter import render_chapter
from .context import Context, block_order
from .front_matter import how_to_read, not_measured, overview, title_lines, unrendered
from .platforms import PLATFORMS, chapter_order, family
from .sections import BY_BENCHMARK

__all__ = ["Report", "build"]


@dataclasses.dataclass(frozen=True)
class Report:
    markdown: str
    images: tuple[str, ...]
    status: dict  # platform -> section benchmark -> list of block labels ([] = not measured)
    unrendered: tuple[str, ...]  # files of benchmarks without a renderer


def build(results: list[Result], out: Path, results_root: str, results_note: str) -> Report:
    """Render ``results`` (paper and ours together) into Markdown, writing plots into ``out``;
    ``results_root`` names the measurements folder in the "Not measured" list."""
    chapters: dict[str, list[Result]] = {key: [] for key in PLATFORMS}
    for r in results:
        chapters.setdefault(family(r.platform), []).append(r)
    order = chapter_order(chapters)
    status: dict[str, dict[str, list[str]]] = {}
    body: list[str] = []
    images: list[str] = []
    for key in order:
        ctx = Context(out, key, sorted(chapters[key], key=block_order))
        lines, status[key] = render_chapter(ctx)
        body += lines
        images += ctx.images
    left = [r for r in results if r.benchmark not in BY_BENCHMARK]
    head = (title_lines(results_note) + findings.render(results) + how_to_read() + overview(status, order)
            + not_measured(status, order, results_root) + unrendered(left))
    return Report("\n".join(head + body).rstrip() + "\n", tuple(images), status, tuple(r.path for r in left))
