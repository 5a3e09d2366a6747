"""The report's sections, in order: which benchmark each renders, its title and the paper
figure or table it mirrors. A benchmark without an entry here is listed under "Results
without a renderer", never dropped."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..results import Result
from . import capacity, crossovers, primitives, roofline, rollout, sweeps, switching, timings
from .context import Context


@dataclasses.dataclass(frozen=True)
class Section:
    benchmark: str
    title: str
    like: str  # what in the paper it corresponds to, or "" when the paper has none
    render: Callable[[Result, Context], list[str]]
    produced_by: str = "measured"  # the non-paper source expected here (crossovers: model)


SECTIONS: tuple[Section, ...] = (
    Section("fixed_layout_sweep", "Fixed-layout throughput sweeps", "the paper's Figures 4, 8, 10 and Tables 4-6",
            sweeps.render),
    Section("crossovers", "Predicted vs measured crossovers", "the paper's Figures 1, 6, 7 against its sweeps",
            crossovers.render, produced_by="model"),
    Section("primitive_costs", "Switch primitive costs", "the paper's Figures 5b/c, 9, 11", primitives.render),
    Section("switch_overhead", "Switch overhead", "the paper's Tables 1, 7, 8", switching.render),
    Section("rollout_serving", "Serving a workload: SPLASH vs fixed layouts",
            "the paper's end-to-end throughput comparison (1.3-1.73x on B200 at T = 8)", rollout.render),
    Section("kv_capacity", "KV capacity per layout", "the paper's Table 3", capacity.render),
    Section("mla_decode", "MLA decode bandwidth against the roofline", "", roofline.render_decode),
    Section("prefill", "Prefill compute rate against the matmul rate", "", roofline.render_prefill),
    Section("plan_speed", "Switch planner speed", "", timings.render),
    Section("scheduler_speed", "Scheduler decision speed", "", timings.render),
)
BY_BENCHMARK = {s.benchmark: s for s in SECTIONS}
