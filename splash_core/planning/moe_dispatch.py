"""How a MoE layer's rows reach their experts and come back: one all-reduce, or an all-to-all
dispatch and combine from the rows' owners (DeepEP's path for DP-attention), priced per layout and
row count so that the cheaper one runs (a pure rule; the runtime compares a step's rows with it).

The all-reduce path (``all_reduce``): every rank holds every row after attention (DP's and CP's owners
gather theirs, TP's and DOP's partial outputs are all-reduced), computes its experts' pairs and its
shard of the shared experts for all rows, and one all-reduce of N·d sums them.

The all-to-all path, where attention leaves rows with their owners (DP, CP; DOP after reducing its
partial outputs to the owners instead of to everyone): an owner routes its rows and sends each row
once to every rank holding one of its experts (with its expert ids and weights), each rank returns
one partial sum per row it received, and the owner adds them and its rows' shared experts (held
whole on every rank); the block's output is then gathered to every rank. Per rank, of N rows::

    all-reduce:  N·d·b / β_AR + λ                                         (+ DOP's O all-reduce, the same)
    all-to-all:  λ (counts) + N·D·(T−1)/T² · (2·d·b + m) / β_A2A + 2λ      (+ DOP's reduction to owners)

with D the distinct ranks a row's experts live on (:func:`ranks_per_row`: DeepSeek's choice rule
on exchangeable scores) and m its routing metadata (k ids and weights).
DP's and CP's gather of the attention output becomes the same gather of the block's output, so it
cancels. Both paths compute the same pairs and the same shared-expert rows; the all-to-all also
reads each step's counts back to the host, so only eager steps take it (captured decode replays the
all-reduce).

DeepSeek-V3 at T = 8 (a group per rank, four groups): D = 3.96 of at most 4, where uniform
routing over the chosen groups would give 3.63 and no group limit 5.3.

What the whole shared experts cost is not priced here, since it does not depend on the step: the
memory (DeepSeek-V3: 88 MB per layer in bf16, 5.1 GB over its 58 MoE layers, against 0.64 GB per
rank as shards at T = 8; the memory plan counts it) and the reads (every step, captured decode
included, reads them whole: an owner's rows need all of them).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..layouts import LAYOUTS, Layout
from ..profiles.deployment import MOE_DISPATCH
from ..profiles.hardware import HardwareProfile
from ..profiles.model import ModelProfile, MoEConfig

OWNER_LAYOUTS = (Layout.DP, Layout.CP, Layout.DOP)  # layouts whose attention can leave rows with their owners
_GB = 1e9


def ranks_per_row(moe: MoEConfig, T: int, rows: int = 8192, seed: int = 0) -> float:
    """D: the mean number of distinct ranks among a row's experts (expert j on rank j // ceil(E / T),
    as ``model.weights.even_shard`` places them) when DeepSeek's choice rule (the top ``topk_group``
    of ``n_group`` groups by their best score, or top-2 sum for ``noaux_tc``, then the top k of
    their experts) meets exchangeable scores (independent, identically distributed: a balanced
    router), from ``rows`` seeded rows."""
    E, k = moe.n_routed_experts, moe.num_experts_per_tok
    choice = np.random.default_rng(seed).random((rows, E))
    if moe.topk_method != "greedy" and moe.n_group > 1:
        grouped = choice.reshape(rows, moe.n_group, E // moe.n_group)
        rank_by = np.sort(grouped, axis=-1)[..., -2:].sum(-1) if moe.topk_method == "noaux_tc" else grouped.max(-1)
        keep = np.zeros(rank_by.shape, dtype=bool)
        np.put_along_axis(keep, np.argsort(-rank_by, axis=1)[:, : moe.topk_group], True, axis=1)
        choice = np.where(keep[..., None], grouped, -np.inf).reshape(rows, E)
    chosen = np.argpartition(-choice, k - 1, axis=1)[:, :k]
    touched = np.zeros((rows, T), dtype=bool)
    np.put_along_axis(touched, chosen // -(-E // T), True, axis=1)
    return float(touched.sum(1).mean())


@dataclasses.dataclass(frozen=True)
class DispatchPrices:
    """The two paths' seconds per MoE layer for one deployment (the module's formulas), at its
    hardware's collective rates; ``ranks_per_row`` is D."""

    moe: MoEConfig
    hidden: int
    hardware: HardwareProfile
    T: int
    act_bytes: int
    ranks_per_row: float

    @classmethod
    def of(cls, model: ModelProfile, hardware: HardwareProfile, T: int, act_bytes: int) -> "DispatchPrices":
        return cls(model.moe, model.hidden_size, hardware, T, act_bytes, ranks_per_row(model.moe, T))

    def seconds(self, layout: Layout, rows: float) -> tuple[float, float]:
        """(all-reduce path, all-to-all path): the seconds in which they differ, per MoE layer, for a
        step of ``rows`` rows with attention in ``layout``."""
        h, T = self.hardware, self.T
        lat = h.collective_latency_us.value * 1e-6
        reduce, a2a, gather = (r.value * _GB for r in (h.all_reduce_gbps, h.all_to_all_gbps, h.all_gather_gbps))
        row = self.hidden * self.act_bytes
        metadata = self.moe.num_experts_per_tok * 8  # int32 expert id and float32 weight each
        crossing = rows * self.ranks_per_row * (T - 1) / T ** 2  # rows each rank receives, and sends back
        all_reduce = rows * row / reduce + lat
        all_to_all = 3 * lat + crossing * (2 * row + metadata) / a2a
        if layout is Layout.DOP:  # its O reduction: to every rank, or to the owners then the block's gather
            all_reduce += rows * row / reduce + lat
            all_to_all += rows * (T - 1) / T * row * (1 / a2a + 1 / gather) + 2 * lat
        return all_reduce, all_to_all

    def crossing_rows(self, layout: Layout) -> int | None:
        """The fewest rows from which the all-to-all is priced below the all-reduce in ``layout``
        (both are linear in rows), or None: never."""
        ar0, a2a0, ar1, a2a1 = (t for rows in (0.0, 1.0) for t in self.seconds(layout, rows))
        slope = (ar1 - ar0) - (a2a1 - a2a0)  # seconds the all-to-all saves per row
        return max(1, int((a2a0 - ar0) // slope) + 1) if slope > 0 else None


@dataclasses.dataclass(frozen=True)
class MoEDispatch:
    """What one model's MoE layers do: ``mode`` (:data:`~splash_core.profiles.deployment.MOE_DISPATCH`),
    per layout the rows from which a step dispatches by all-to-all (absent: never), and the ``prices``
    the rule came from (None: all-reduce only)."""

    mode: str = "all_reduce"
    from_rows: tuple[tuple[Layout, int], ...] = ()
    prices: DispatchPrices | None = dataclasses.field(default=None, compare=False)

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

    def savings(self, rows: float) -> np.ndarray:
        """[layouts, as ``LAYOUTS``]: seconds one MoE layer of an eager step of ``rows`` rows saves by
        the rule's choice."""
        out = np.zeros(len(LAYOUTS))
        if self.prices is None or not self.from_rows:  # the scheduler asks every step: nothing to price
            return out
        for i, layout in enumerate(LAYOUTS):
            if self.by_all_to_all(layout, int(rows)):
                all_reduce, all_to_all = self.prices.seconds(layout, rows)
                out[i] = all_reduce - all_to_all
        return out


def dispatch_rule(mode: str, model: ModelProfile, hardware: HardwareProfile, T: int, act_bytes: int) -> MoEDispatch:
    """The rule for ``mode``: ``all_to_all`` in every owner layout; ``cheaper`` where
    :class:`DispatchPrices` price it below the all-reduce; ``all_reduce``, or a model without
    routed experts or one rank: never."""
    if mode == "all_reduce" or model.moe is None or T == 1:
        return MoEDispatch(mode)
    prices = DispatchPrices.of(model, hardware, T, act_bytes)
    if mode == "all_to_all":
        return MoEDispatch(mode, tuple((l, 1) for l in OWNER_LAYOUTS), prices)
    crossing = ((l, prices.crossing_rows(l)) for l in OWNER_LAYOUTS)
    return MoEDispatch(mode, tuple((l, n) for l, n in crossing if n is not None), prices)
