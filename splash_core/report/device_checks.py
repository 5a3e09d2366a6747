"""Correctness on the device: the kernels in the compute format against the torch reference
(``mla_correctness``: max errors per kernel config and kernel; ``kda_correctness``: the KDA
kernels of flash-linear-attention), the distributed runtime in each layout against a float32
reference (``runtime_equivalence``), and the conformance suite per backend (``conformance``).

Every number is read from the result's samples; the summaries' counts and verdicts agree with
them (checked when the file is read, :mod:`splash_core.results.shapes`)."""

from __future__ import annotations

import re

from ..results import Result
from .context import Context
from .markdown import MISSING, bold, table

LAYOUT_ORDER = ("TP", "CP", "DP", "DOP")
# pytest's closing line, e.g. "20 passed, 1 skipped, 14 warnings in 27.60s"
_OUTCOME = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")
_SECONDS = re.compile(r"\bin ([\d.]+)s\b")
_RANKS = re.compile(r"--splash-ranks[ =](\d+)")


def err(value: float | None) -> str:
    """A small error in three significant digits (0.00195, 9.54e-07)."""
    return MISSING if value is None else f"{value:.3g}"


def _verdict(ok: bool) -> str:
    return "yes" if ok else bold("FAILED")


def render_mla(result: Result, _ctx: Context) -> list[str]:
    summary, samples = result["summary"], result["samples"]
    kernels = list(dict.fromkeys(s["kernel"] for s in samples))
    groups: dict[tuple[str, int], list[dict]] = {}
    for s in samples:
        groups.setdefault((s["config"], s["heads"]), []).append(s)
    rows = []
    for (config, heads), checks in groups.items():
        cells = [_mla_cell([c for c in checks if c["kernel"] == k]) for k in kernels]
        rows.append([config, str(heads), *cells, _verdict(all(c["ok"] for c in checks))])
    cases = sorted({s["case"] for s in samples if "case" in s})
    lines = [f"{summary['checks']} checks, {summary['failed']} failed. Each cell: the largest |error| of the "
             f"output / of the log-sum-exp over the cases run" + (f" ({', '.join(cases)})" if cases else "")
             + "; *equal* where the check compares bit for bit. A check passes within the compute format's "
             "tolerance of the conformance suite.", ""]
    return lines + table(["config", "heads", *kernels, "all ok"], rows, "lr" + "r" * len(kernels) + "l") + [""]


def _mla_cell(checks: list[dict]) -> str:
    if not checks:
        return MISSING
    outs = [c["max_abs_err_out"] for c in checks if "max_abs_err_out" in c]
    lses = [c["max_abs_err_lse"] for c in checks if "max_abs_err_lse" in c]
    ok = all(c["ok"] for c in checks)
    if not outs and not lses:  # a bit-for-bit comparison
        return "equal" if ok else f"{bold('FAILED')} (not equal)"
    text = f"{err(max(outs, default=None))} / {err(max(lses, default=None))}"
    return text if ok else f"{bold('FAILED')} {text}"


def render_kda(result: Result, _ctx: Context) -> list[str]:
    summary = result["summary"]
    rows = [[s["kernel"], err(s.get("rel_err_out")), err(s.get("rel_err_state")), _verdict(s["ok"]),
             s.get("error", "")] for s in result["samples"]]
    lines = [f"{summary['checks']} checks, {summary['failed']} failed. Relative error (‖got − reference‖ / "
             "‖reference‖) of the output and of the final state.", ""]
    return lines + table(["kernel", "output rel. error", "state rel. error", "ok", "error"], rows, "lrrll") + [""]


def render_equivalence(result: Result, _ctx: Context) -> list[str]:
    summary = result["summary"]
    models = list(dict.fromkeys(s["model"] for s in result["samples"]))  # in the order they ran
    samples = sorted(result["samples"], key=lambda s: (models.index(s["model"]), LAYOUT_ORDER.index(s["layout"])))
    rows = [[s["model"], s["layout"], err(s["rel_err"]), err(s["max_abs_err"]), f"{s['ref_scale']:.3g}",
             str(s["greedy_mismatches"]), str(s["decisive_mismatches"]), str(s["steps"]), _verdict(s["passed"])]
            for s in samples]
    verdict = ("Every layout passed." if summary["passed"]
               else f"{bold('Failed')}: {', '.join(summary['failed'])}.")
    lines = [f"Kernels: {summary['kernels']}. A layout passes when max |logit error| ≤ {summary['tolerance']:g} × "
             "max |reference logit| (relative error below) and no greedy mismatch is decisive: a token may differ "
             "from the reference's only where the reference's top-2 margin is within twice the max error "
             f"(a near tie). {verdict}", ""]
    headers = ["model", "layout", "rel. error", "max abs error", "reference logit scale", "greedy mismatches",
               "decisive", "steps", "passed"]
    return lines + table(headers, rows, "llrrrrrrl") + [""]


def pytest_counts(line: str) -> dict[str, int]:
    """Outcome counts of pytest's closing line ('20 passed, 1 skipped in 3s' -> {'passed': 20, 'skipped': 1});
    'errors' counts as 'error'."""
    counts: dict[str, int] = {}
    for n, outcome in _OUTCOME.findall(line):
        key = "error" if outcome.startswith("error") else outcome
        counts[key] = counts.get(key, 0) + int(n)
    return counts


def render_conformance(result: Result, _ctx: Context) -> list[str]:
    passed = result["summary"]
    rows = []
    for s in result["samples"]:
        counts = pytest_counts(s["summary"])
        total = sum(counts.values())
        tally = ([f"{counts.get('passed', 0)} / {total}", str(counts.get("failed", 0) + counts.get("error", 0)),
                  str(counts.get("skipped", 0))] if total else [MISSING] * 3)  # the suite did not get to report
        seconds = _SECONDS.search(s["summary"])
        ranks = _RANKS.search(s.get("command", ""))
        rows.append([s["backend"], ranks[1] if ranks else MISSING, *tally, str(s["returncode"]),
                     _verdict(passed[s["backend"]]), f"{float(seconds[1]):.0f}" if seconds else MISSING])
    lines = ["`pytest --pyargs splash_core.testing` per backend: its description, device, hardware profile, "
             "streams, collectives on the spawned ranks, and the MLA and KDA kernels against the torch reference "
             "in the compute format.", ""]
    headers = ["backend", "ranks", "passed / total", "failed + errors", "skipped", "exit code", "suite passed",
               "seconds"]
    return lines + table(headers, rows, "lrrrrrlr") + [""]
