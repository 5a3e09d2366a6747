"""CPU timings of the planner (``plan_speed``), the scheduler (``scheduler_speed``) and the
policy's decisions beside a pre-copy (``precopy_planning``): p50 and p95 per case, in microseconds."""

from __future__ import annotations

from ..results import Result
from .context import Context
from .markdown import fixed, table


def render(result: Result, _ctx: Context) -> list[str]:
    rows = [[c["case"], fixed(c["p50_us"], 1), fixed(c["p95_us"], 1), str(c["runs"])]
            for c in result["summary"]["cases"]]
    return table(["case", "p50 µs", "p95 µs", "runs"], rows) + [""]
