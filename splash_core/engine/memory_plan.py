"""Per-rank memory of a deployment in each layout, from the tensors its runtime would load
(:mod:`splash_core.checkpoint.footprint`): weights by part, the decode-graph pool, the reserve,
and the KV pool the memory left over buys. What ``splash capacity --deployment`` prints and what
the preflight refuses a job by, before any weight is read.

The budget is the hardware's memory times the deployment's ``memory_fraction``. Graph memory is
the hardware profile's measured ``graph_pool_mib`` where the deployment replays captured decode
graphs. Activation scratch is not planned separately: the engine plans none beyond the reserve
(``reserve_gib``). A deployment with ``ffn_weights: fp8`` holds its experts and MLPs as stored; one
with ``attention_weights: fp8`` its MLA layers' head-indexed projections, plus KV-B's copy in the
compute format (:class:`~splash_core.model.mla.MLAWeights`).
The profile's ``common_gib`` (M0 of Eq 6, a hand-set stand-in for the weights outside attention)
is not used here: those weights are counted from their tensors.
"""

from __future__ import annotations

import dataclasses

from .. import dtypes
from ..checkpoint.footprint import HEAD_INDEXED, PARTS, RankWeights, stored_tensors
from ..layouts import Layout, Placement
from ..profiles.graphs import decode_capturable
from ..profiles.hardware import GIB
from ..profiles.model import LayerKind

MIB = 1 << 20
FFN_PARTS = ("experts", "mlp")  # what ``ffn_weights: fp8`` keeps as stored (the router stays float32)


@dataclasses.dataclass(frozen=True)
class LayoutMemory:
    """The busiest rank of one layout: weights per part (as held today and FP8-kept), the graph
    pool, the reserve, and the KV the rest buys (pages of every cache-bearing layer)."""

    layout: Layout
    rank: int
    parts: dict[str, int]  # bytes per part, as the runtime holds them (compute format)
    fp8_parts: dict[str, int]  # bytes per part, FP8 tensors kept FP8 (codes + block scales)
    graphs: int
    reserve: int
    budget: int
    page_bytes: int  # one KV page of every cache-bearing layer
    page_size: int

    @property
    def weights(self) -> int:
        return sum(self.parts.values())

    @property
    def fp8_weights(self) -> int:
        return sum(self.fp8_parts.values())

    def left(self, fp8: bool = False) -> int:
        """Bytes left for the KV pool (negative: the rest does not fit)."""
        return self.budget - self.reserve - self.graphs - (self.fp8_weights if fp8 else self.weights)

    def kv_pages(self, fp8: bool = False) -> int:
        return max(0, self.left(fp8)) // self.page_bytes if self.page_bytes else 0

    def kv_tokens(self, fp8: bool = False) -> int:
        """Tokens of history one rank can hold in every cache-bearing layer."""
        return self.kv_pages(fp8) * self.page_size


@dataclasses.dataclass(frozen=True)
class DeploymentMemory:
    """Every layout's :class:`LayoutMemory` of one deployment, and where the tensors came from."""

    deployment: str
    T: int
    held: str  # the formats the runtime holds weights in, in words
    source: str
    layouts: tuple[LayoutMemory, ...]

    def of(self, layout: Layout) -> LayoutMemory:
        return next(m for m in self.layouts if m.layout is layout)


def graph_pool_bytes(deployment) -> int:
    """The decode-graph pool one rank holds: the hardware's measured pool where graphs are captured."""
    hw, kinds = deployment.hardware, deployment.layer_kinds
    captured = (hw.captures_graphs and deployment.graphs.mode != "off" and LayerKind.MLA in kinds
                and decode_capturable(kda=LayerKind.KDA in kinds))
    return int(hw.graph_pool_mib.value * MIB) if captured and hw.graph_pool_mib is not None else 0


def deployment_memory(deployment, layouts=tuple(Layout)) -> DeploymentMemory:
    """The memory plan of ``deployment`` (headers or config.json only: no weight is read)."""
    tensors, source = stored_tensors(deployment.model, deployment.layers, deployment.compute_dtype,
                                     deployment.keeps_fp8)
    table = RankWeights(deployment.model, tensors, deployment.T, deployment.compute_dtype,
                        shared_whole=deployment.moe_dispatch != "all_reduce")
    graphs = graph_pool_bytes(deployment)
    kept = FFN_PARTS if deployment.ffn_weights == "fp8" else ()  # feed-forward weights held as stored
    attention = deployment.attention_weights == "fp8"
    kept += (HEAD_INDEXED,) if attention else ()
    out = []
    for layout in layouts:
        rank, held = table.busiest(layout)
        parts = {p: held[p].fp8 if p in kept else held[p].runtime for p in PARTS}
        if attention:
            parts[HEAD_INDEXED] += _kv_b_copies(deployment, layout)
        out.append(LayoutMemory(layout, rank, parts,
                                {p: held[p].fp8 for p in PARTS}, graphs, int(deployment.reserve_bytes),
                                int(deployment.memory_budget_bytes), int(deployment.kv_page_bytes),
                                deployment.page_size))
    held = deployment.compute_dtype + (", feed-forward FP8 (ffn_weights: fp8)" if FFN_PARTS[0] in kept else "")
    held += ", attention projections FP8 (attention_weights: fp8)" if attention else ""
    return DeploymentMemory(deployment.name, deployment.T, held, source, tuple(out))


def _kv_b_copies(deployment, layout: Layout) -> int:
    """Bytes of the compute-format KV-B copies a rank of ``layout`` holds beside MLA projections kept FP8."""
    m = deployment.model.mla
    if m is None:
        return 0
    heads = m.heads // deployment.T if layout.placement is Placement.SHARDED else m.heads
    per_layer = heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank * dtypes.nbytes(deployment.compute_dtype)
    return deployment.layer_kinds.count(LayerKind.MLA) * per_layer


def gib(n: float) -> str:
    """GiB to two decimals; MiB below a hundredth of a GiB (a pool one page too big is not "0.00 GiB over")."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB / 100 else f"{n / (1 << 20):.2f} MiB"


def refusal(plan: DeploymentMemory, kv_bytes: int | None = None) -> str | None:
    """One line naming what does not fit on which rank in which layout, or None when every layout
    holds its weights, the graph pool, the reserve and ``kv_bytes`` of KV pool (default: one page)."""
    kv = plan.layouts[0].page_bytes if kv_bytes is None else kv_bytes
    m = max(plan.layouts, key=lambda m: m.weights + m.graphs + m.reserve - m.budget)  # the tightest layout
    over = m.weights + m.graphs + m.reserve + kv - m.budget
    if over > 0:
        biggest = max(m.parts, key=m.parts.get)
        part = f"{biggest} {gib(m.parts[biggest])}"
        what = (f"a KV pool of {gib(kv)} does not fit" if m.weights + m.graphs + m.reserve <= m.budget else
                f"the weights ({gib(m.weights)} held in {plan.held}; {part}) do not fit")
        fp8 = (f"; FP8-kept weights would need {gib(m.fp8_weights)}" if m.fp8_weights < m.weights else "")
        return (f"deployment {plan.deployment!r} does not fit: {what} rank {m.rank} in {m.layout}: "
                f"{gib(over)} over its {gib(m.budget)} budget (with {gib(m.graphs)} of graphs and "
                f"{gib(m.reserve)} reserve{fp8})")
    return None
