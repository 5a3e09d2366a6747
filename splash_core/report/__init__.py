"""``splash report``: a Markdown report with PNG plots from benchmark results.

:func:`render_report` reads every result under the results folder (validated by
:mod:`splash_core.results`) and the paper's numbers under the reference folder
(:mod:`.paper`), and writes ``<out>/README.md`` with its images beside it: the findings
(:mod:`.findings`), an overview, one list of what each platform has not measured, then one
chapter per platform with a section per benchmark kind it has numbers for (:mod:`.sections`),
each block labelled measured, paper or model. It needs no GPU and no network. Images it wrote before and no longer links
are removed; other files in ``out`` are left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..results import read_results
from .document import Report, build
from .paper import load_reference

__all__ = ["Report", "render_report"]


def render_report(results: str | Path | None, out: str | Path, reference: str | Path = "bench/reference") -> Report:
    """Render the report into ``out``; ``results`` None means no measurements folder exists.

    Raises :class:`~splash_core.results.ResultError` naming the file and field of a malformed
    result, and FileNotFoundError if ``reference`` lacks the paper's data."""
    measured = read_results(results) if results is not None else []
    paper = load_reference(reference)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    readme = out / "README.md"
    previous = set(re.findall(r"\]\(([^)/]+\.png)\)", readme.read_text())) if readme.is_file() else set()
    root = Path(results).as_posix() if results is not None else "bench/results"
    found = (f"{len(measured)} result file(s) under `{root}`" if results is not None
             else f"no results folder `{root}` (nothing measured yet)")
    note = (f"`splash report --results {root} --reference {Path(reference).as_posix()} --out {out.as_posix()}` "
            f"read {found} and the paper's numbers under `{Path(reference).as_posix()}`; no GPU, no network.")
    report = build(paper + measured, out, root, note)
    readme.write_text(report.markdown)
    for stale in previous - set(report.images):
        (out / stale).unlink(missing_ok=True)
    return report
