"""Deployment profiles: backend + hardware + model + group size + memory policy + scheduler."""

from __future__ import annotations

import dataclasses
import math
import types

from .. import dtypes
from ..formatting import size
from ..layouts import Layout
from .checkpoint_config import model_from_yaml
from .graphs import GraphConfig
from .hardware import GIB, HardwareProfile
from .model import LayerKind, ModelProfile
from .projections import layer_weight_bytes
from .quantity import Quantity
from .schema import Problem, field, fraction, non_negative, one_of, positive, unit_interval
from .transfer import TransferConfig

FORMS = ("auto", "absorbed", "expanded")  # how prefill rows attend (splash_core.planning.attention_forms)
RESIDENCIES = ("transfer", "last_token")  # how long a prompt's KV stays in the prefill pool
ADMISSIONS = ("continuous", "waves")  # how the prefill group admits queued requests
WEIGHT_FORMATS = ("compute", "fp8")  # how a rank holds the feed-forward weights and the attention projections
MOE_DISPATCH = ("all_reduce", "all_to_all", "cheaper")  # how MoE rows reach their experts (planning.moe_dispatch)


def _default_overlap():
    # η of Eq 10: the fraction of attention work a layout's communication may hide behind.
    return types.MappingProxyType({Layout.TP: 0.0, Layout.CP: 0.5, Layout.DP: 0.0, Layout.DOP: 0.0})


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """How π(x; θ) turns predicted step times into a layout choice (paper §4.2)."""

    margin: float = field(
        "switch only when another layout's predicted step is at least this fraction faster",
        default=0.05,
        checks=[unit_interval],
    )
    min_steps_between_switches: int = field(
        "steps to stay in a layout after a switch before another is considered", default=0, checks=[non_negative]
    )
    overlap: dict[Layout, float] = field(
        "η per layout: fraction of attention time that hides communication (Eq 10)",
        default_factory=_default_overlap,
    )
    precopy_interference: float = field(
        "α: fraction of a pre-copy's background copy time that the step it runs beside loses to it "
        "(splash_core.planning.precopy_time); the default is what page copies cost the decode steps pre-copies run "
        "beside on one H200 (B = 16, 128K: bench/results/h200/copy_interference-decode.json; 0.75 beside a "
        "128K prefill step)",
        default=0.48,
        checks=[unit_interval],
    )

    def problems(self):
        for layout, eta in self.overlap.items():
            if not 0 <= eta <= 1:
                yield Problem(f"overlap.{layout}", "must be in [0, 1]", eta)


@dataclasses.dataclass(frozen=True)
class Disaggregation:
    """The paper's fixed-layout protocol (§5.1, appendix C): this group prefills in the layout
    under test and hands each prompt's KV to a separate decode group that runs one fixed
    layout (DP-attention in the paper) on the same model and hardware."""

    prefill_chunk: int = field("prefill tokens per step over the whole group (SGLang's chunked-prefill "
                               "size; owner layouts split it evenly over their ranks)", default=16384,
                               checks=[positive])
    cp_prompts_per_step: int | None = field(
        "prompts one CP prefill step takes at most (SGLang's context-parallel prefill splits one prompt "
        "over the ranks; None: as many as the chunk holds)", default=1)
    decode_T: int = field("ranks of the decode group", default=8, checks=[positive])
    decode_layout: Layout = field("the decode group's fixed attention layout", default=Layout.DP)
    decode_memory_fraction: float = field("fraction of device memory the decode group may use", default=0.9,
                                          checks=[fraction])
    decode_common_gib: float = field("M_0 of Eq 6 on a decode rank (its dense/MoE shard, activations), GiB",
                                     default=0.0, checks=[non_negative])
    kv_transfer_gbps: Quantity | None = field(
        "bandwidth one prefill rank sends a finished prompt's KV to the decode group at, GB/s "
        "(absent: the transfer takes no time)", default=None)
    prefill_pool_tokens: dict[Layout, float] = field(
        "distinct tokens the prefill group's KV pool holds per layout, as the testbed reports them (the "
        "paper's Table 3); a layout absent here gets Eq 6's room for KV pages. A rank holds 1/T of them, "
        "TP every one (it replicates each history)", default_factory=dict)
    prefill_residency: str = field(
        "how long a prompt's KV stays in the prefill pool: transfer (until it reaches the decode group, as "
        "SGLang's disaggregation frees it) or last_token (until the request's last output token)",
        default="transfer", checks=[one_of(*RESIDENCIES)])
    cp_recurrent: str = field(
        "where the testbed's CP computes a chunk's recurrent (KDA) rows: owner (which holds the state, as "
        "SPLASH's runtime does) or positions (where the chunk's positions live, handing the state from rank "
        "to rank: a chunked scan)", default="owner", checks=[one_of("owner", "positions")])
    admission: str = field(
        "how the prefill group admits queued requests: continuous (each as soon as it fits, as SPLASH's and "
        "SGLang's engines do) or waves (a batch that does not fit runs in waves: the next wave is admitted "
        "only once every request of the last one has left the pool)", default="continuous",
        checks=[one_of(*ADMISSIONS)])

    def problems(self):
        for layout, tokens in self.prefill_pool_tokens.items():
            if not (math.isfinite(tokens) and tokens > 0):
                yield Problem(f"prefill_pool_tokens.{layout}", "must be a positive, finite number of tokens", tokens)


@dataclasses.dataclass(frozen=True)
class DeploymentProfile:
    """One serving deployment: what runs where, with how much memory, switching how."""

    profile_kind = "deployment"

    name: str = field("profile name")
    hardware: HardwareProfile = field("hardware profile (name or path)")
    model: ModelProfile = field("model profile: its name or path, its keys, a checkpoint folder {path: DIR} or "
                                "the tiny checkpoint SPLASH writes, {builtin: NAME}", parse=model_from_yaml)
    T: int = field("ranks in the group that switches together", checks=[positive])
    backend: str = field("backend plugin name, or auto", default="auto")
    memory_fraction: float = field("fraction of device memory SPLASH may use", default=0.9, checks=[fraction])
    reserve_gib: float = field("R_r of Eq 5/6: reserve kept free per rank, GiB", default=1.0, checks=[non_negative])
    common_gib: float = field(
        "M_0 of Eq 6: per-rank memory of state outside attention (dense/MoE shards, activations), GiB",
        default=0.0,
        checks=[non_negative],
    )
    page_size: int = field("tokens per KV page", default=64, checks=[positive])
    initial_layout: Layout = field("layout the group starts in", default=Layout.TP)
    compute_dtype: str = field("activation/weight format the runtime computes in", default="bf16", checks=[one_of(*dtypes.NAMES)])
    sparse_attention: bool | None = field(
        "top-k attention with the model's indexer (DeepSeek-V3.2's DSA) as SGLang's sparse FlashMLA runs it; "
        "None: whenever the model has an indexer. The cost model charges what this says runs",
        default=None)
    prefill_attention: str = field(
        "how prefill rows attend: absorbed (MQA over the latent cache), expanded (MHA over keys expanded "
        "through kv_b, as transformers and SGLang prefill), or auto (per request, the form with fewer FLOPs "
        "(splash_core.planning.attention_forms): at DeepSeek-V3's widths a fresh prompt's chunk, or a chunk of more than "
        "about 170 rows after a long history). DOP always attends "
        "absorbed; a backend without an expanded kernel too", default="auto", checks=[one_of(*FORMS)])
    ffn_weights: str = field(
        "how a rank holds the feed-forward weights (routed and shared experts, dense MLPs): compute (dequantized "
        "to compute_dtype at load) or fp8 (block-scaled e4m3 as an FP8 checkpoint stores them, about half the "
        "bytes of bf16; seeded weights are then drawn FP8 as such a checkpoint would hold them)",
        default="compute", checks=[one_of(*WEIGHT_FORMATS)])
    attention_weights: str = field(
        "how a rank holds the MLA layers' head-indexed projections (Q-B, KV-B, O): compute (dequantized to "
        "compute_dtype at load) or fp8 (block-scaled e4m3 as an FP8 checkpoint stores them, switches moving them "
        "FP8 with their scales; KV-B also keeps a compute_dtype copy for the absorbed per-head products)",
        default="compute", checks=[one_of(*WEIGHT_FORMATS)])
    moe_dispatch: str = field(
        "how MoE layers' rows reach their experts: all_reduce (every rank holds every row after attention and "
        "one all-reduce sums the experts' outputs), all_to_all (where attention leaves rows with their owners, "
        "DP, CP and DOP, in eager steps: each owner sends its rows to their experts' ranks and gets their sums "
        "back, DeepEP-style; every rank then holds the shared experts whole) or cheaper (as all_to_all, but "
        "only in the steps where the hardware profile's collective rates price it below the all-reduce)",
        default="all_reduce", checks=[one_of(*MOE_DISPATCH)])
    layers: int | None = field("run only the first N layers (None: the whole model)", default=None)
    collective_timeout_s: float = field("a collective that takes longer fails the group", default=300.0, checks=[positive])
    seed: int = field("seed for generated weights", default=0)
    scheduler: SchedulerConfig = field("scheduler settings", default=SchedulerConfig())
    transfer: TransferConfig = field("how a switch moves state (routes, chunks, pipelining)", default=TransferConfig())
    graphs: GraphConfig = field("how decode steps replay captured graphs (buckets, table widths)", default=GraphConfig())
    disaggregation: Disaggregation | None = field(
        "how `splash sweep` runs the paper's prefill/decode protocol (None: one decode group like this one, "
        "DP-attention, same memory settings)", default=None)
    notes: str = field("caveats", default="")

    def problems(self):
        mla, kda = self.model.mla, self.model.kda
        if mla is not None and LayerKind.MLA in self.model.layer_kinds and mla.heads % self.T:
            yield Problem("T", f"must divide the model's {mla.heads} MLA heads", self.T)
        if kda is not None and LayerKind.KDA in self.model.layer_kinds and kda.heads % self.T:
            yield Problem("T", f"must divide the model's {kda.heads} KDA heads", self.T)
        if self.moe_dispatch != "all_reduce" and not (self.model.moe and self.model.runtime_experts):
            why = "has none" if self.model.moe is None else "runs a dense stand-in (runtime_experts: false)"
            yield Problem("moe_dispatch", f"needs a model with routed experts; {self.model.name!r} {why}",
                          self.moe_dispatch)
        if self.page_size & (self.page_size - 1):
            yield Problem("page_size", "must be a power of two", self.page_size)
        if self.layers is not None and not 0 < self.layers <= self.model.num_layers:
            yield Problem("layers", f"must be in 1..{self.model.num_layers}", self.layers)
            return  # the budget below counts the layers that run
        yield from self._budget_problems()

    def _budget_problems(self):
        """Eq 6 for an empty batch: the budget less M0 and the reserve must hold the attention
        weights in a replicated layout and one KV page of every layer, or nothing can run."""
        left = self.memory_budget_bytes - self.common_bytes - self.reserve_bytes
        need = self.attention_weight_bytes + self.kv_page_bytes
        if left >= need:
            return
        # name the key to change: what eats the budget, else the budget itself
        if self.common_gib + self.reserve_gib >= self.memory_budget_bytes / GIB:
            key = "common_gib" if self.common_gib >= self.reserve_gib else "reserve_gib"
        else:
            key = "memory_fraction" if self.memory_fraction < 1 else "hardware"
        got = self.hardware.name if key == "hardware" else getattr(self, key)
        yield Problem(key, f"the memory budget leaves no room for weights and KV: hardware.memory_gib "
                           f"{self.hardware.memory_gib.value:g} x memory_fraction {self.memory_fraction:g} = "
                           f"{size(self.memory_budget_bytes)} per rank, less common_gib {self.common_gib:g} and "
                           f"reserve_gib {self.reserve_gib:g}, leaves {size(left)}; the attention weights and one "
                           f"KV page need {size(need)}", got)

    @property
    def memory_budget_bytes(self) -> float:
        """H_r scaled by the memory fraction: what SPLASH may use per rank."""
        return self.hardware.memory_bytes * self.memory_fraction

    @property
    def reserve_bytes(self) -> float:
        return self.reserve_gib * GIB

    @property
    def keeps_fp8(self) -> bool:
        """Whether a rank keeps any weights FP8 as stored (seeded weights are then drawn so)."""
        return "fp8" in (self.ffn_weights, self.attention_weights)

    @property
    def common_bytes(self) -> float:
        return self.common_gib * GIB

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Kinds of the layers that run (the first ``layers``, or all)."""
        return self.model.layer_kinds[: self.layers or self.model.num_layers]

    @property
    def attention_weight_bytes(self) -> float:
        """W_r of Eq 6 in a replicated layout (DP, CP): the head-indexed projections of every layer
        that runs, whole (TP and DOP hold 1/T of them)."""
        return float(sum(layer_weight_bytes(self.model, kind) for kind in self.layer_kinds))

    @property
    def kv_page_bytes(self) -> float:
        """One KV page (latent + rotary, and indexer keys where the layer stores them) of every MLA
        layer that runs."""
        return float(self.page_size * self.model.cache_bytes_per_token_over(range(len(self.layer_kinds))))

    @property
    def kv_budget_bytes(self) -> float:
        """What the KV pool may use per rank: the budget less M0, the reserve and the replicated
        attention weights (so every layout can hold the weights it needs)."""
        return self.memory_budget_bytes - self.common_bytes - self.reserve_bytes - self.attention_weight_bytes
