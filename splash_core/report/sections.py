"""The report's sections, in order: which benchmark each renders, its title and the paper
figure or table it mirrors. A benchmark without an entry here is listed under "Results
without a renderer", never dropped. Consecutive sections with the same ``group`` render as
parts of one section of that name (e.g. "Correctness on the device")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..results import Result
from . import (capacity, costmodel_check, crossovers, decode_step, device_checks, expanded, graph_memory, host_time,
               moe_dispatch, page_runs, peer_kernels, prefill_forms, primitives, real_widths, rollout, roofline, served,
               sparse_step, steps, sweeps, switch_trace, switching, timings, transport, tuning)
from .context import Context


@dataclasses.dataclass(frozen=True)
class Section:
    benchmark: str
    title: str
    like: str  # what in the paper it corresponds to, or "" when the paper has none
    render: Callable[[Result, Context], list[str]]
    produced_by: str = "measured"  # the non-paper source expected here (crossovers: model)
    group: str = ""  # the section this one is a part of, or "" for a section of its own

    @property
    def label(self) -> str:
        """The name in the overview: 'group: title' for a part, else the title."""
        return f"{self.group}: {self.title}" if self.group else self.title


TUNING = "Kernel tuning"
CORRECTNESS = "Correctness on the device"
HOST = "Host time"
SECTIONS: tuple[Section, ...] = (
    Section("fixed_layout_sweep", "Fixed-layout throughput sweeps", "the paper's Figures 4, 8, 10 and Tables 4-6",
            sweeps.render),
    Section("crossovers", "Predicted vs measured crossovers", "the paper's Figures 1, 6, 7 against its sweeps",
            crossovers.render, produced_by="model"),
    Section("primitive_costs", "Switch primitive costs", "the paper's Figures 5b/c, 9, 11", primitives.render),
    Section("switch_overhead", "Switch overhead", "the paper's Tables 1, 7, 8", switching.render),
    Section("switch_trace", "Where a switching step's time goes", "the paper's appendix G (imperfect overlap)",
            switch_trace.render),
    Section("transport_probe", "Moving state without processors: collective kernels vs copy engines",
            "the paper's appendix G (transfers share the device with computation)", transport.render),
    Section("copy_interference", "Page copies beside a step: kernels vs memcpy (pulls)",
            "the paper's appendix G (transfers share the device with computation)", transport.render_copies),
    Section("page_runs", "Page runs serving leaves histories in (what pulls need)", "", page_runs.render),
    Section("rollout_serving", "Serving a workload: SPLASH vs fixed layouts",
            "the paper's end-to-end throughput comparison (1.3-1.73x on B200 at T = 8)", rollout.render),
    Section("served_bench", "Served: SGLang's benchmark client against splash serve", "", served.render),
    Section("kv_capacity", "KV capacity per layout", "the paper's Table 3", capacity.render),
    Section("mla_decode", "MLA decode bandwidth against the roofline", "", roofline.render_decode),
    Section("prefill", "Prefill compute rate against the matmul rate", "", roofline.render_prefill),
    Section("expanded_attention", "Expanded-form prefill attention against flash SDPA", "", expanded.render),
    Section("graph_memory", "Decode graphs' memory and capture time at start-up", "the paper's appendix G "
            "(graph capture)", graph_memory.render),
    Section("prefill_forms", "Prefill attending absorbed or expanded: one rollout", "", prefill_forms.render),
    Section("real_widths", "A real-widths DeepSeek-V3 checkpoint: load and steps", "", real_widths.render),
    Section("peer_kernels", "MLA decode beside FlashMLA and SGLang", "", peer_kernels.render),
    Section("mla_kernel_sweep", "Attention tile sweep", "", tuning.render_sweep, group=TUNING),
    Section("gpu_rates", "Measured device ceilings (the rooflines)", "", tuning.render_rates, group=TUNING),
    Section("runtime_step", "Runtime step times", "", steps.render),
    Section("decode_step", "A decode step replayed from its captured graph", "the paper's §4.1 step 3 (per-layout "
            "device graphs captured at start-up)", decode_step.render),
    Section("dsa_step", "DeepSeek Sparse Attention: a decode step and a prefill chunk, dense and sparse", "",
            sparse_step.render_dsa),
    Section("fp8_gemm", "Block-scaled FP8 GEMMs beside bf16 and row-wise FP8", "", sparse_step.render_fp8_gemm),
    Section("moe_dispatch", "MoE layers reaching their experts: all-reduce vs all-to-all", "", moe_dispatch.render),
    Section("costmodel_check", "Cost model vs runtime step times", "", costmodel_check.render, produced_by="model"),
    Section("runtime_host_profile", "Runtime host time per layer", "", host_time.render_runtime, group=HOST),
    Section("switch_host_profile", "Host work of a live switch", "", host_time.render_switch, group=HOST),
    Section("precopy_step", "Host work of a pre-copy across steps", "", host_time.render_precopy, group=HOST),
    Section("mla_correctness", "MLA kernels vs the torch reference", "", device_checks.render_mla,
            group=CORRECTNESS),
    Section("kda_correctness", "KDA kernels (fla) vs the torch recurrence", "", device_checks.render_kda,
            group=CORRECTNESS),
    Section("runtime_equivalence", "Runtime per layout vs a float32 reference", "",
            device_checks.render_equivalence, group=CORRECTNESS),
    Section("conformance", "Conformance suite per backend", "", device_checks.render_conformance,
            group=CORRECTNESS),
    Section("plan_speed", "Switch planner speed", "", timings.render),
    Section("scheduler_speed", "Scheduler decision speed", "", timings.render),
    Section("precopy_planning", "Decisions beside a pre-copy (--switch-mode auto)", "", timings.render),
    Section("sampling_speed", "Choosing sampled tokens: on the device or row by row on the host", "", timings.render),
)
BY_BENCHMARK = {s.benchmark: s for s in SECTIONS}
