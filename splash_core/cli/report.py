"""``splash report``: render the benchmark report (Markdown + PNG plots) from committed results."""

from __future__ import annotations

from pathlib import Path

from ..results import ResultError
from .main import UsageError
from .output import print_json, table

DEFAULT_RESULTS = "bench/results"


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="render the benchmark report (measured beside the paper's numbers)")
    p.add_argument("--results", default=None,
                   help=f"folder of results/<platform>/*.json (default {DEFAULT_RESULTS}; may be absent)")
    p.add_argument("--reference", default="bench/reference", help="folder of the paper's CSVs (default bench/reference)")
    p.add_argument("--out", default="report", help="output folder for README.md and its images (default report)")
    p.add_argument("--json", action="store_true", help="machine-readable summary of what was rendered")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..report import render_report  # matplotlib loads only when a report is drawn

    results = args.results
    if results is None:
        results = DEFAULT_RESULTS if Path(DEFAULT_RESULTS).is_dir() else None
    elif not Path(results).is_dir():
        raise FileNotFoundError(f"results folder {results} does not exist")
    try:
        report = render_report(results, args.out, args.reference)
    except ResultError as exc:
        raise UsageError(str(exc)) from None
    readme = Path(args.out) / "README.md"
    if args.json:
        print_json({"report": str(readme), "images": list(report.images), "status": report.status,
                    "unrendered": list(report.unrendered)})
        return 0
    platforms = list(report.status)
    rows = [[benchmark] + [", ".join(report.status[p][benchmark]) or "-" for p in platforms]
            for benchmark in next(iter(report.status.values()))]
    print(table(rows, ["section", *platforms], align="l" * (len(platforms) + 1)))
    print(f"\nwrote {readme} and {len(report.images)} image(s)"
          + (f"; {len(report.unrendered)} result file(s) without a renderer" if report.unrendered else ""))
    return 0
