"""What captured decode graphs cost the scheduler: re-capture time in a switch (Eq 7) and graph
memory in Eq 6's scratch term A.

The runtime (:mod:`splash_core.runtime.decode_graphs`) keeps one graph per (layers' layouts,
padded bucket) and drops every graph on old addresses when a layer takes other weight tensors.
Which switches do that is the weights mover's (:mod:`splash_core.runtime.switch.weights_mover`):

- sharded → replicated at T > 1 gathers new full tensors; replicated → sharded cuts a new shard
  (a copy) out of the full tensors; so every switch between TP/DOP and DP/CP moves them;
- TP ↔ DOP and DP ↔ CP at T > 1 keep the tensors, and the graphs of both layouts stay valid;
- at T = 1 every tensor is full: a switch into a sharded layout (TP, DOP) still cuts a new
  "shard" (a copy of all heads), one into a replicated layout (DP, CP) keeps the tensors.

After a switch that moves weights the first decode step captures the destination layout's
graph of its bucket (that capture is charged to the switch); the step of another bucket
captures its own graph when it first comes (a lazy capture, charged when it happens:
:class:`HeldGraphs`). The time of one capture is ``layers × capture_s_per_layer`` (warm-up runs
included, as the runtime records it).

Every graph of a rank lives in one shared memory pool, whose size the largest step's buffers
set, not the layers or the buckets (on one H200 the 7 buckets up to 64 held 128 MiB in TP and
132 MiB in DOP at 10 and at 61 layers alike: ``bench/results/h200/graph_memory.json``). Eq 6
counts that pool, ``pool_bytes``, in every layout. The two constants are the hardware profile's
(``graph_capture_ms_per_layer``, ``graph_pool_mib``): a profile without them describes a backend
that captures nothing, and nothing is charged.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Iterable, Sequence

import numpy as np

from ..layouts import LAYOUTS, Layout, Placement
from ..profiles.graphs import bucket_of

MIB = float(1 << 20)


def moves_weights(src: Layout, dst: Layout, T: int) -> bool:
    """Whether a switch ``src → dst`` gives the layers other weight tensors (so the runtime drops
    every captured graph and captures the destination's again); see the module docstring."""
    if src is dst:
        return False
    if T == 1:
        return dst.placement is Placement.SHARDED
    return src.placement is not dst.placement


def weight_sharing(layout: Layout, T: int) -> tuple[Layout, ...]:
    """``layout`` and every layout it switches to and from without moving weights (their graphs
    stay held together), in LAYOUTS order."""
    return tuple(l for l in LAYOUTS if l is layout or not (moves_weights(layout, l, T) or moves_weights(l, layout, T)))


@dataclasses.dataclass(frozen=True)
class GraphCosts:
    """Capture time and graph memory of one deployment's decode graphs."""

    capture_s_per_layer: float  # host time of one capture, per layer of the graph
    pool_bytes: float  # device memory of the rank's graph pool (every layout and bucket)
    layers: int  # layers in a captured step (every layer that runs)
    buckets: tuple[int, ...]  # rows per owner a decode step is padded to (GraphConfig.buckets)
    T: int

    @classmethod
    def of(cls, hardware, layers: int, buckets: Sequence[int], T: int) -> "GraphCosts | None":
        """The deployment's graph costs, or None where the hardware profile says its backend
        captures nothing (no capture terms)."""
        if not hardware.captures_graphs:
            return None
        memory = hardware.graph_pool_mib
        return cls(hardware.graph_capture_ms_per_layer.value * 1e-3, 0.0 if memory is None else memory.value * MIB,
                   int(layers), tuple(int(b) for b in buckets), int(T))

    @property
    def capture_s(self) -> float:
        """Host time of one capture: one (layout, bucket) graph of the whole step."""
        return self.layers * self.capture_s_per_layer

    def bucket(self, x) -> int | None:
        """The bucket the decode steps of batch ``x`` (a BatchArrays) are padded to (:func:`decode_bucket`)."""
        return decode_bucket(self.buckets, x, self.T)

    def held_buckets(self, x) -> int:
        """How many buckets' graphs a layout holds for batch ``x``: every bucket up to its own
        (all of them beyond the largest, which the start-up captured)."""
        b = self.bucket(x)
        return len(self.buckets) if b is None else self.buckets.index(b) + 1

    def held_bytes(self, x) -> np.ndarray:
        """[layouts]: graph memory each layout holds per rank for batch ``x`` (Eq 6's A): the pool."""
        return np.full(len(LAYOUTS), self.pool_bytes)

    def recapture_s(self, src: Layout, dst: Layout, x) -> float:
        """Eq 7's re-capture term of a switch ``src → dst`` for batch ``x``: the capture of the
        destination's graph of the batch's bucket, where the switch moves weights (0 where it
        keeps them, or where the batch's decode steps run eagerly beyond the largest bucket)."""
        if not moves_weights(src, dst, self.T) or self.bucket(x) is None:
            return 0.0
        return self.capture_s


class HeldGraphs:
    """The graphs the runtime holds as a policy serves (the simulator's model of
    :class:`~splash_core.runtime.decode_graphs.DecodeGraphs`): (layout, bucket) pairs on the
    current weights. :meth:`step` returns the capture time a step spends on a graph it lacks."""

    def __init__(self, costs: GraphCosts, layout: Layout, start_buckets: Iterable[int]):
        self.costs = costs
        self.held = {(layout, b) for b in start_buckets}  # the start-up captures (not charged)
        self.lazy_s = 0.0  # captures made while serving, beyond those charged to switches
        self.lazy = 0

    @classmethod
    def at_start(cls, costs: GraphCosts, layout: Layout, concurrency: int) -> "HeldGraphs":
        """The start-up captures: ``layout``'s graph of every bucket up to the one holding
        ``concurrency`` rows per owner (the engine's ``capture_all``)."""
        top = next((b for b in costs.buckets if b >= concurrency), costs.buckets[-1])
        return cls(costs, layout, [b for b in costs.buckets if b <= top])

    def switch(self, src: Layout, dst: Layout, x) -> None:
        """A switch landed: graphs on old addresses are dropped; the destination's graph of the
        batch's bucket is the one the switch was charged for (:meth:`GraphCosts.recapture_s`)."""
        if moves_weights(src, dst, self.costs.T):
            self.held.clear()
            b = self.costs.bucket(x)
            if b is not None:
                self.held.add((dst, b))

    def step(self, layout: Layout, x) -> float:
        """Capture time a pure decode step of batch ``x`` in ``layout`` spends first (0 when its
        graph is held, or when it runs eagerly)."""
        b = self.costs.bucket(x) if x.decode else None
        if b is None or (layout, b) in self.held:
            return 0.0
        self.held.add((layout, b))
        self.lazy += 1
        self.lazy_s += self.costs.capture_s
        return self.costs.capture_s


def capture_costs_from_samples(samples) -> float:
    """Seconds per layer of one capture from ``bench/decode_step.py``'s samples: the median over
    its ``graph`` samples that captured of ``capture_s / layers`` (each point captures one bucket)."""
    mine = [s for s in samples if s.get("path") == "graph" and s.get("capture_s") and s.get("layers")]
    if not mine:
        raise ValueError("no graph samples with a capture time in the results")
    return float(statistics.median(s["capture_s"] / s["layers"] for s in mine))


def decode_bucket(buckets: Sequence[int], x, T: int) -> int | None:
    """The bucket of ``buckets`` the decode steps of batch ``x`` (a BatchArrays) are padded to: the
    busiest owner's requests (one row each in decode), None beyond the largest (they run eagerly)."""
    busiest = int(np.bincount(np.asarray(x.owners, dtype=np.int64), minlength=T).max()) if len(x) else 0
    return bucket_of(buckets, busiest)
