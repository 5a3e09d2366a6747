"""``splash report``: render the benchmark report (Markdown + PNG plots) from committed results.

The results and the paper's reference data default to the project's ``bench/results`` and
``bench/reference``, found from any directory; the report goes to ``--out`` (``report`` under
the current directory). The terminal shows a summary that fits 120 columns; the details are in
the Markdown."""

from __future__ import annotations

from pathlib import Path

from ..paths import project_path
from ..results import ResultError
from .args import NO_MATPLOTLIB, UsageError, can_draw, existing_dir, writable_dir
from .output import print_json, table

DEFAULT_RESULTS, DEFAULT_REFERENCE = "bench/results", "bench/reference"


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="render the benchmark report (measured beside the paper's numbers)")
    p.add_argument("--results", type=existing_dir, default=None,
                   help=f"folder of results/<platform>/*.json (default: the project's {DEFAULT_RESULTS}, if any)")
    p.add_argument("--reference", type=existing_dir, default=None,
                   help=f"folder of the paper's CSVs (default: the project's {DEFAULT_REFERENCE})")
    p.add_argument("--out", type=writable_dir, default="report",
                   help="output folder for README.md and its images (default report)")
    p.add_argument("--json", action="store_true", help="machine-readable summary of what was rendered")
    p.set_defaults(func=run)


def run(args) -> int:
    if not can_draw():
        raise UsageError(NO_MATPLOTLIB)
    from ..report import render_report  # matplotlib loads only when a report is drawn

    results = args.results
    if results is None:
        results = project_path(DEFAULT_RESULTS)
        results = results if results.is_dir() else None
    reference = args.reference or project_path(DEFAULT_REFERENCE)
    try:
        report = render_report(results, args.out, reference)
    except ResultError as exc:
        raise UsageError(str(exc)) from None
    readme = Path(args.out) / "README.md"
    if args.json:
        print_json({"report": str(readme), "images": list(report.images), "status": report.status,
                    "unrendered": list(report.unrendered)})
        return 0
    print(table(_summary_rows(report), ["section", *report.status], align="l" * (len(report.status) + 1)))
    print(f"\nblocks per section and platform (paper, measured, model; - none); the details are in {readme}")
    print(f"wrote {readme} and {len(report.images)} image(s)"
          + (f"; {len(report.unrendered)} result file(s) without a renderer" if report.unrendered else ""))
    return 0


def _summary_rows(report) -> list[list[str]]:
    """One row per section (its benchmark name), one cell per platform: how many blocks of
    each source it rendered, e.g. 'paper, 2 measured' (the Markdown has titles and labels)."""
    sections = next(iter(report.status.values()))
    rows = []
    for benchmark in sections:
        row = [benchmark]
        for platform in report.status:
            sources = [label.split(" ", 1)[0] for label in report.status[platform][benchmark]]
            counts = {s: sources.count(s) for s in dict.fromkeys(sources)}
            row.append(", ".join(s if s == "paper" and n == 1 else f"{n} {s}" for s, n in counts.items()) or "-")
        rows.append(row)
    return rows
