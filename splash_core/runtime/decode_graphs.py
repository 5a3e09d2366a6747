"""Decode steps replayed from captured graphs: one per (layers' layouts, padded batch bucket, and
for a model with DeepSeek Sparse Attention whether some context exceeds its top-k).

Data flow of a decode step that :meth:`DecodeGraphs.run` takes (docs/design.md §3 step 6):

1. the model reserved the step's pages (as every step does);
2. the bucket is the smallest of ``config.buckets`` holding the busiest owner's rows; the
   device block tables (:class:`~splash_core.runtime.device_tables.DeviceTables`) give new
   requests a row, widen to the batch's longest context where needed, and write the entries
   that changed (a new page: one entry per layer);
3. the graph of (layouts, bucket, sparse) is looked up, and captured first where it is missing or was
   captured on addresses that changed since: a layer that took other weights (a live switch
   lands new tensors: its ``weights_version``) or tables that were reallocated (``epoch``);
4. the bucket's :class:`~splash_core.runtime.static_step.DecodeInputs` are refreshed in place and
   the graph replays: embedding, every layer, LM head, and the greedy token of every row;
5. the caller selects the real rows' logits or tokens (:class:`DecodeOutputs`), and reads the
   step's fault flag (NaN indexer scores) with them.

A sparse graph scores every key slot of the tables' width (unheld slots cost no read and rank
last), keeps each row's top-k and attends over it, exactly the eager step's selection; a step
whose contexts all fit in k replays the bucket's dense graph, as the eager step attends densely.

Where the backend has no :class:`~splash_core.platform.interfaces.GraphOps` (the CPU reference), step 4
runs the same function eagerly: the static-buffer logic is the one tested on gloo at T = 1..4.

A switching step runs eagerly (it needs per-layer events and lands new weights layer by layer);
the next decode step finds the switched layers' versions changed and captures the destination
layout's graph for its bucket. That is the simpler of the two correct designs: the other keeps
every layer's weights in stable buffers that a switch copies into (graphs of every layout
captured once at start-up, no re-capture, at the memory of a replicated and a sharded copy of
W_A per layer). A mover that writes into the weights' own tensors and hands the layer the same
object (no version bump) gets it without any change here. Each capture's time and graph memory
are kept in :attr:`DecodeGraphs.captures` (for Eq 7's switch cost and Eq 6's scratch term).
"""

from __future__ import annotations

import dataclasses
import traceback
import warnings
import weakref
from typing import Any

import torch

from ..layouts import Layout, Ownership
from ..planning import ownership
from ..platform.interfaces import GraphOps
from ..profiles.graphs import GraphConfig
from .device_tables import DeviceTables
from .static_step import DecodeInputs, StaticStepContext, skeleton
from .step_batch import StepBatch


@dataclasses.dataclass
class _Graph:
    """One captured (or, without graph ops, eagerly run) decode step of one bucket."""

    layouts: tuple[Layout, ...]
    per_owner: int
    signature: tuple
    inputs: DecodeInputs
    run: Any  # () -> (logits [T b, V], tokens [T b], fault flag or None): the step's function
    captured: Any = None  # the backend's CapturedGraph, or None (eager)
    outputs: tuple | None = None

    def replay(self) -> tuple:
        if self.captured is None:
            self.outputs = self.run()
        else:
            self.captured.replay()
        return self.outputs


@dataclasses.dataclass
class DecodeOutputs:
    """A replayed step's outputs for the ``requests`` requests of its batch, in batch order."""

    graph: _Graph
    requests: int

    def logits(self) -> torch.Tensor:
        """[R, V] float32 logits (a copy: the buffers are rewritten by the next replay)."""
        return self.graph.outputs[0].index_select(0, self.graph.inputs.places(self.requests))

    def tokens(self) -> torch.Tensor:
        """[R] int64 greedy tokens, chosen on the device inside the graph."""
        return self.graph.outputs[1].index_select(0, self.graph.inputs.places(self.requests))

    def failed(self) -> torch.Tensor | None:
        """A copy of the step's device flag, true where its indexer scores held NaN (None: no indexer scored)."""
        flag = self.graph.outputs[2]
        return None if flag is None else flag.clone()


class DecodeGraphs:
    """The captured decode steps of one rank's :class:`~splash_core.runtime.model.Model`."""

    def __init__(self, model, config: GraphConfig, graph_ops: GraphOps | None):
        # a proxy: the model holds these graphs, so a strong reference back would keep a deleted
        # model's device memory until the garbage collector finds the cycle
        self.model, self.config, self.ops = weakref.proxy(model), config, graph_ops
        # rows for every request the largest bucket runs at once (up to 256, then they grow), so
        # start-up captures survive the first requests
        self.tables = DeviceTables([layer.kv for layer in model.paged_layers], model.device,
                                   min_width=config.min_table_pages, rows=min(model.T * config.buckets[-1], 256) + 1)
        self.pool = graph_ops.new_pool() if graph_ops is not None else None
        # DSA: steps whose longest context exceeds this replay the sparse graphs (None: no indexer)
        self.topk = max((getattr(layer, "index_topk", 0) for layer in model.paged_layers), default=0) or None
        self.graphs: dict[tuple, _Graph] = {}
        self.captures: list[dict] = []  # every capture: layouts, bucket, width, seconds, bytes, why
        self.failed: dict[tuple, str] = {}  # (layouts, bucket, sparse) whose capture failed -> why: they run eagerly
        self._signature: tuple | None = None
        self._stale: set[tuple] = set()  # keys whose graph was dropped for changed addresses

    # ---- which steps ----------------------------------------------------------------------

    def bucket(self, batch: StepBatch) -> int | None:
        """The bucket of ``batch``, or None when it does not take this path (not pure decode, or
        more rows on an owner than the largest bucket)."""
        if not batch.is_decode:
            return None
        return self.config.bucket(int(batch.owner_rows.max()))

    def selects(self, batch: StepBatch) -> bool:
        """Whether ``batch`` replays its bucket's sparse graph: the model has an indexer and some
        context exceeds its top-k (the eager step's rule for attending sparsely)."""
        return self.topk is not None and int(batch.contexts.max()) > self.topk

    def key(self, batch: StepBatch) -> tuple | None:
        """The graph ``batch`` replays, (layers' layouts, bucket, sparse); None off this path."""
        per_owner = self.bucket(batch)
        return None if per_owner is None else (self.layouts(), per_owner, self.selects(batch))

    def layouts(self) -> tuple[Layout, ...]:
        return tuple(layer.layout for layer in self.model.layers)

    def table_width(self, batch: StepBatch) -> int:
        """Entries a table row needs for ``batch``: its longest context's pages, held whole (TP, DP,
        DOP) or every T-th (CP) by the layers' layouts; computed from the batch alone, so every
        rank widens its tables at the same step."""
        return self._width(int(batch.contexts.max()))

    def _width(self, context: int) -> int:
        pages = int(ownership.pages_for(context, self.model.page_size))
        split = all(layer.layout.ownership is Ownership.POSITIONS for layer in self.model.paged_layers)
        return -(-pages // self.model.T) if split else pages

    # ---- one step -------------------------------------------------------------------------

    def run(self, batch: StepBatch, tokens: torch.Tensor) -> DecodeOutputs | None:
        """Run decode ``batch`` (pages reserved) from the graph of its bucket; None when it does
        not take this path (the caller runs the step eagerly)."""
        per_owner = self.bucket(batch)
        if per_owner is None:
            return None
        rows = self.tables.prepare(batch.ids, self.table_width(batch))
        graph = self._graph(per_owner, self.selects(batch))
        if graph is None:
            return None
        graph.inputs.fill(batch, rows, tokens)
        graph.replay()
        return DecodeOutputs(graph, len(batch))

    def release(self, request: int) -> None:
        self.tables.release(request)

    def signature(self) -> tuple:
        """What the graphs' addresses depend on besides their own buffers and their layouts (their
        key): the tables' tensors and each layer's weights. A switch that keeps a layer's weights
        (between DP and CP, or TP and DOP) keeps the graphs of both layouts valid."""
        return (self.tables.epoch, tuple(layer.weights_version for layer in self.model.layers))

    def _graph(self, per_owner: int, sparse: bool = False) -> _Graph | None:
        signature = self.signature()
        key = (self.layouts(), per_owner, sparse)
        if signature != self._signature:  # drop graphs on old addresses now: their memory goes back
            self._stale |= {k for k, g in self.graphs.items() if g.signature != signature}
            self.graphs = {k: g for k, g in self.graphs.items() if g.signature == signature}
            self._signature = signature
        graph = self.graphs.get(key)
        if graph is None and key not in self.failed:
            graph = self._capture(key, signature, "again: addresses changed" if key in self._stale else "first")
            if graph is not None:
                self.graphs[key] = graph
                self._stale.discard(key)
        return graph

    def capture_all(self, max_rows_per_owner: int | None = None, max_context: int | None = None) -> list[dict]:
        """Capture the current layouts' graph of every bucket (up to the one that holds
        ``max_rows_per_owner``) now, at start-up, with padding rows only: they write the sink
        pages and read no key. The tables are first widened to ``max_context`` tokens (if given:
        the longest history any request can reach), since they keep their width until a batch
        needs more, and then each bucket is captured again. Collective: every rank. Returns the
        records of the captures it made."""
        before = len(self.captures)
        if max_context is not None:
            self.tables.prepare([], self._width(max_context))
        if max_rows_per_owner is not None:
            max_rows_per_owner = self.config.bucket(max_rows_per_owner) or self.config.buckets[-1]
        sparse = [False] + ([True] if self.topk is not None and (max_context is None or max_context > self.topk) else [])
        for per_owner in self.config.buckets:
            if max_rows_per_owner is None or per_owner <= max_rows_per_owner:
                for selects in sparse:
                    self._graph(per_owner, selects)
        return self.captures[before:]

    def describe(self) -> str:
        """One line for a start-up log: buckets, the padding rule, captures so far."""
        s = self.summary()
        how = "captured" if self.ops is not None else "static buffers run eagerly (no graph ops)"
        return (f"decode graphs ({how}): buckets {','.join(map(str, s['buckets']))} rows per owner, every owner "
                f"padded to the bucket of the busiest (padding rows read no key, write the sink page); tables "
                f"{s['table_width']} pages wide ({s['table_bytes'] / (1 << 20):.0f} MiB); {s['captures']} captures, {s['seconds']:.2f} s, "
                f"{s['bytes'] / (1 << 20):.0f} MiB" + "".join(f"; failed: {why}" for why in s["failed"]))

    def _capture(self, key: tuple, signature: tuple, why: str) -> _Graph | None:
        m = self.model
        layouts, per_owner, sparse = key
        inputs = DecodeInputs(m.T, per_owner, m.device)
        batch = skeleton(m.T, per_owner, m.page_size)

        def step():
            ctx = StaticStepContext(batch, m.rank, m.device, m.collectives, m.kernels, inputs, self.tables, sparse)
            logits = m.forward(ctx, inputs.tokens)
            return logits, logits.argmax(dim=-1), torch.stack(ctx.nan_scores).any() if ctx.nan_scores else None

        graph = _Graph(layouts, per_owner, signature, inputs, step)
        record = {"layouts": sorted({str(l) for l in layouts}), "bucket": per_owner, "sparse": sparse,
                  "rows": m.T * per_owner,
                  "table_width": self.tables.width, "captured": self.ops is not None, "why": why}
        if self.ops is not None:
            try:
                graph.captured = self.ops.capture(step, self.pool, warmup=self.config.warmup)
            except Exception as exc:  # noqa: BLE001 - the same on every rank: this bucket runs eagerly
                first = exc.__context__ or exc  # what broke the capture, where ending it raised again
                frame = traceback.extract_tb(first.__traceback__)[-1:] if first.__traceback__ else []
                where = f" at {frame[0].filename}:{frame[0].lineno}" if frame else ""
                why = self.failed[key] = f"{type(first).__name__}: {str(first).splitlines()[0] if str(first) else ''}{where}"
                # a capture that failed may leave its pool recording: later captures take a fresh one
                self.pool = self.ops.new_pool()
                warnings.warn(f"rank {m.rank}: capturing the decode graph of {record['layouts']} bucket {per_owner} "
                              f"failed, its steps run eagerly: {why}")
                self.captures.append({**record, "seconds": 0.0, "bytes": 0, "why": f"failed: {why}"})
                return None
            graph.outputs = graph.captured.outputs
            record.update(seconds=graph.captured.capture_s, bytes=int(graph.captured.nbytes))
        else:  # nothing to record: every replay runs the step
            record.update(seconds=0.0, bytes=0)
        self.captures.append(record)
        return graph

    def summary(self) -> dict:
        """Captures so far: how many, their host time and graph memory, the buckets and widths."""
        return {"captures": len(self.captures), "seconds": float(sum(c["seconds"] for c in self.captures)),
                "bytes": int(sum(c["bytes"] for c in self.captures)), "live": len(self.graphs),
                "buckets": list(self.config.buckets), "table_width": self.tables.width,
                "table_bytes": self.tables.nbytes,
                "failed": sorted(set(self.failed.values()))}

