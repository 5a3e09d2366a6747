"""How a MoE layer's rows reach their experts and come back: one all-reduce, or an all-to-all
dispatch and combine from the rows' owners (DeepEP's path for DP-attention), priced per layout and
row count so that the cheaper one runs (a pure rule; the runtime compares a step's rows with it).

Today's path (``all_reduce``): every rank holds every row after attention (DP's and CP's owners
gather theirs, TP's and DOP's partial outputs are all-reduced), computes its experts' pairs and its
shard of the shared experts for all rows, and one all-reduce of N·d sums them.

The all-to-all path, where attention leaves rows with their owners (DP, CP; DOP after reducing its
partial outputs to the owners instead of to everyone): an owner routes its rows and sends each row
once to every rank holding one of its experts (with its expert ids and weights), each rank returns
one partial sum per row it received, and the owner adds them and its rows' shared experts (held
whole on every rank); the block's output is then gathered to every rank. Per rank, of N rows::

    all-reduce:  N·d·b / β_AR + λ                                         (+ DOP's O all-reduce, the same)
    all-to-all:  λ (counts) + N·D·(T−1)/T² · (2·d·b + m) / β_A2A + 2λ      (+ DOP's reduction to owners)

with D the distinct ranks a row's experts live on (the router's own, on exchangeable scores:
:func:`~splash_core.model.experts.ranks_per_row`) and m its routing metadata (k ids and weights).
DP's and CP's gather of the attention output becomes the same gather of the block's output, so it
cancels. Both paths compute the same pairs and the same shared-expert rows; the all-to-all also
reads each step's counts back to the host, so only eager steps take it (captured decode replays the
all-reduce).

DeepSeek-V3 at T = 8 (a group per rank, four groups): D = 3.97 of at most 4, where uniform
routing over the chosen groups would give 3.63 and no group limit 5.3.

What the whole shared experts cost is not priced here, since it does not depend on the step: the
memory (DeepSeek-V3: 88 MB per layer in bf16, 5.1 GB over its 58 MoE layers, against 0.64 GB per
rank as shards at T = 8; the memory plan counts it) and the reads (every step, captured decode
included, reads them whole: an owner's rows need all of them).
"""

from __future__ import annotations

import dataclasses

from ..layouts import Layout
from ..profiles.deployment import MOE_DISPATCH
from ..profiles.hardware import HardwareProfile
from ..profiles.model import ModelProfile, MoEConfig

OWNER_LAYOUTS = (Layout.DP, Layout.CP, Layout.DOP)  # layouts whose attention can leave rows with their owners
_GB = 1e9


@dataclasses.dataclass(frozen=True)
class MoEDispatch:
    """What one model's MoE layers do: ``mode`` (:data:`~splash_core.profiles.deployment.MOE_DISPATCH`) and,
    per layout, the rows from which a step dispatches by all-to-all (absent: never)."""

    mode: str = "all_reduce"
    from_rows: tuple[tuple[Layout, int], ...] = ()

    def __post_init__(self):
        if self.mode not in MOE_DISPATCH:
            raise ValueError(f"moe_dispatch must be one of {', '.join(MOE_DISPATCH)}; got {self.mode!r}")

    @property
    def shared_whole(self) -> bool:
        """Whether every rank holds the shared experts whole (owners compute their rows' shared output)."""
        return self.mode != "all_reduce"

    def by_all_to_all(self, layout: Layout, rows: int) -> bool:
        """Whether a step of ``rows`` rows whose attention is in ``layout`` dispatches by all-to-all."""
        return any(layout is l and rows >= n for l, n in self.from_rows)


def path_seconds(moe: MoEConfig, hidden: int, hardware: HardwareProfile, T: int, act_bytes: int,
                 ranks_per_row: float, layout: Layout, rows: float) -> tuple[float, float]:
    """(all-reduce path, all-to-all path): the seconds in which they differ, per MoE layer, for a
    step of ``rows`` rows with attention in ``layout`` (see the module's formulas)."""
    lat = hardware.collective_latency_us.value * 1e-6
    reduce = hardware.all_reduce_gbps.value * _GB
    a2a = hardware.all_to_all_gbps.value * _GB
    gather = hardware.all_gather_gbps.value * _GB
    row = hidden * act_bytes
    metadata = moe.num_experts_per_tok * 8  # int32 expert id and float32 weight each
    crossing = rows * ranks_per_row * (T - 1) / T ** 2  # rows each rank receives, and sends back
    all_reduce = rows * row / reduce + lat
    all_to_all = 3 * lat + crossing * (2 * row + metadata) / a2a
    if layout is Layout.DOP:  # its O reduction: to every rank, or to the owners then the block's gather
        all_reduce += rows * row / reduce + lat
        all_to_all += rows * (T - 1) / T * row * (1 / a2a + 1 / gather) + 2 * lat
    return all_reduce, all_to_all


def moe_dispatch(mode: str, model: ModelProfile, hardware: HardwareProfile, T: int, act_bytes: int,
                 ranks_per_row: float) -> MoEDispatch:
    """The rule for ``mode``: ``all_to_all`` in every owner layout; ``cheaper`` where
    :func:`path_seconds` prices it below the all-reduce, from the crossing row count (both are linear
    in rows); ``all_reduce``, or a model without routed experts or one rank: never."""
    if mode == "all_reduce" or model.moe is None or T == 1:
        return MoEDispatch(mode)
    if mode == "all_to_all":
        return MoEDispatch(mode, tuple((l, 1) for l in OWNER_LAYOUTS))
    out = []
    for layout in OWNER_LAYOUTS:
        ar0, a2a0, ar1, a2a1 = (t for rows in (0.0, 1.0) for t in path_seconds(
            model.moe, model.hidden_size, hardware, T, act_bytes, ranks_per_row, layout, rows))
        slope = (ar1 - ar0) - (a2a1 - a2a0)  # seconds the all-to-all saves per row
        if slope > 0:
            out.append((layout, max(1, int((a2a0 - ar0) // slope) + 1)))
    return MoEDispatch(mode, tuple(out))
