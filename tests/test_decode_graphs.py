"""Decode graphs' bookkeeping on CPU (gloo cannot be captured, so a host stand-in records them):
requests joining and finishing between replays, bucket changes, a live switch followed by
replays in the destination layout, and re-captures, keep every history intact; a replay never
reads other addresses than its capture did. Greedy tokens and logits must be the single-process
reference's throughout (tests/test_runtime_equivalence.py covers every layout at T = 1..4)."""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import torch
from switch_scenarios import MODEL, PAGE, SEED, Req, assert_matches, prompt, reference, serve

from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights
from splash_core.profiles import schema
from splash_core.profiles.graphs import GraphConfig
from splash_core.profiles.loader import load
from splash_core.runtime.decode_graphs import DecodeGraphs
from splash_core.runtime.device_tables import DeviceTables
from splash_core.runtime.kv_pool import LayerKV, PageFormat
from splash_core.runtime.model import Model
from splash_core.runtime.switch import SwitchExecutor

TP, DP, DOP, CP = Layout.TP, Layout.DP, Layout.DOP, Layout.CP


def _read(model) -> list[torch.Tensor]:
    """Every tensor a decode step reads whose address can change: weights, block tables, caches."""
    out = [model.graphs.tables.pages, model.graphs.tables.index]
    for layer in model.layers:
        w = layer.weights
        out += [w.q_b, w.kv_b, w.o, w.down, layer.kv.kv]
    return out


@dataclasses.dataclass
class _Recorded:
    """What a host capture keeps: the function, the outputs every replay rewrites in place, and
    the tensors the capture read (weakly: a replay after one of them is gone, or replaced, reads
    memory a real graph no longer owns)."""

    fn: object
    outputs: tuple
    read: list
    model: object
    capture_s: float = 0.0
    nbytes: int = 0
    replays: int = 0

    def replay(self) -> None:
        now = _read(self.model)
        assert len(now) == len(self.read) and all(r() is t for r, t in zip(self.read, now)), \
            "a graph replayed on tensors other than its capture's"
        for out, new in zip(self.outputs, self.fn()):
            if out is not None:  # (no fault flag where nothing scored)
                out.copy_(new)
        self.replays += 1


class HostGraphOps:
    """:class:`~splash_core.platform.interfaces.GraphOps` on the host with a graph's contract: warm-up
    runs, then a recorded call whose outputs later replays rewrite in place."""

    def __init__(self, model):
        self.model = model
        self.graphs: list[_Recorded] = []
        self.pools: list[object] = []

    def new_pool(self):
        self.pools.append(object())
        return self.pools[-1]

    def capture(self, fn, pool, warmup=2):
        assert pool is self.pools[-1]  # captures share the newest pool
        for _ in range(warmup):
            fn()
        graph = _Recorded(fn, tuple(None if t is None else t.clone() for t in fn()),
                          [weakref.ref(t) for t in _read(self.model)], self.model)
        self.graphs.append(graph)
        return graph


def _model(ctx, layout, config=GraphConfig(mode="static"), pages=32):
    model = Model.from_context(ctx, load("model", MODEL), SeededWeights(SEED), layout, pages_per_layer=pages,
                               page_size=PAGE)
    model.graphs = DecodeGraphs(model, config, HostGraphOps(model))
    return model


# Short prompts arriving at staggered steps: pure decode steps (replayed) alternate with steps
# that prefill a newcomer (eager); requests finish at different steps; rows per owner cross buckets.
JOINING = [Req(0, 0, prompt(9, 1), 12), Req(1, 1, prompt(30, 2), 6), Req(2, 1, prompt(5, 3), 9, arrives=4),
           Req(3, 0, prompt(12, 4), 3, arrives=6), Req(4, 1, prompt(17, 5), 5, arrives=9),
           Req(5, 1, prompt(3, 6), 4, arrives=10)]


def _joining(ctx, layout):
    model = _model(ctx, layout, GraphConfig(mode="static", min_table_pages=1))
    replayed = []

    def step(k, batch, tokens):
        before = sum(g.replays for g in model.graphs.ops.graphs)
        logits = model.step(batch, tokens)
        replayed.append(sum(g.replays for g in model.graphs.ops.graphs) > before)
        return logits

    served = serve(step, JOINING, ctx.world_size, model.release)
    return {"served": served, "replayed": replayed, "captures": model.graphs.captures,
            "rows_left": dict(model.graphs.tables.row_of), "kv_left": model.nbytes()["kv"]}


@pytest.fixture(scope="module")
def joining_reference():
    return reference(JOINING)


@pytest.mark.parametrize("layout", list(Layout))
def test_requests_joining_and_finishing_between_replays(rank_pools, joining_reference, layout):
    results = rank_pools(2).run(_joining, layout)
    for rank, res in enumerate(results):
        assert_matches(res["served"], joining_reference, f"{layout} rank {rank}")
        assert res["rows_left"] == {} and res["kv_left"] == 0
    res = results[0]
    assert 8 <= sum(res["replayed"]) < len(res["replayed"])  # decode steps replayed, prefill steps eager
    buckets = {c["bucket"] for c in res["captures"]}
    assert {1, 2} <= buckets, res["captures"]  # rows per owner crossed a bucket boundary
    # contexts outgrew one-page tables: the tables widened and the graphs were captured again
    widths = [c["table_width"] for c in res["captures"]]
    assert widths == sorted(widths) and widths[-1] >= 2 and any(c["why"] != "first" for c in res["captures"])


# step -> destination: weights gathered (TP->DP), kept (DP->CP->DP: the DP graph stays valid and
# replays again), cut (DP->TP: new shards, so TP's graph is captured again), kept (TP->DOP)
SWITCHES = {5: DP, 8: CP, 11: DP, 14: TP, 17: DOP}
TOUR = [Req(0, 0, prompt(9, 1), 22), Req(1, 1, prompt(14, 2), 20), Req(2, 1, prompt(5, 3), 18, arrives=1)]


def _tour(ctx):
    model = _model(ctx, TP)
    executor = SwitchExecutor(model, ctx)
    layouts = []

    def step(k, batch, tokens):
        if k in SWITCHES:
            logits, _ = executor.step(batch, tokens, SWITCHES[k])
        else:
            logits = model.step(batch, tokens)
        layouts.append(str(model.layers[0].layout))
        return logits

    served = serve(step, TOUR, ctx.world_size, model.release)
    return {"served": served, "captures": model.graphs.captures, "layouts": layouts,
            "replays": [g.replays for g in model.graphs.ops.graphs]}


def test_a_switch_is_followed_by_replays_in_the_destination_layout(rank_pools):
    ref = reference(TOUR)
    results = rank_pools(2).run(_tour)
    for rank, res in enumerate(results):
        assert_matches(res["served"], ref, f"rank {rank}")
    res = results[0]
    assert res["layouts"][-1] == "DOP"
    captured = [(c["layouts"][0], c["bucket"], c["why"]) for c in res["captures"]]
    assert captured[:5] == [("TP", 2, "first"), ("DP", 2, "first"), ("CP", 2, "first"),
                            ("TP", 2, "again: addresses changed"), ("DOP", 2, "first")], captured
    assert all(n > 0 for n in res["replays"])  # every graph replayed, DP's before and after CP


def test_device_tables_write_only_what_changed():
    fmt = PageFormat(4, 3, torch.float32)
    kvs = [LayerKV(i, 16, fmt, "cpu") for i in range(2)]
    tables = DeviceTables(kvs, "cpu", min_width=2)
    for kv in kvs:
        kv.alloc(7, [0, 1])
    rows = tables.prepare([7], 2)
    assert rows.tolist() == [1] and tables.pages[:, 1, :2].tolist() == [kvs[0].pages_of(7)[1].tolist()] * 2
    epoch = tables.epoch
    for kv in kvs:
        kv.alloc(7, [2])  # a decode step opens a page: one entry per layer, after widening to 4
        kv.alloc(9, [0])
    assert tables.prepare([7, 9], 3).tolist() == [1, 2] and tables.epoch == epoch + 1 and tables.width == 4
    assert tables.pages[0, 1].tolist() == kvs[0].pages_of(7)[1].tolist() + [-1]
    tables.release(7)
    assert tables.pages[:, 1].eq(-1).all() and tables.prepare([11], 4).tolist() == [1]  # the row is reused
    slots = tables.write_slots(torch.tensor([2, 0]), torch.tensor([1, 5]), 4, 1, kvs[0].sink_slot)
    assert slots[0].tolist() == [kvs[0].pages_of(9)[1][0] * 4 + 1, kvs[0].sink_slot]  # row 0 pads: the sink


def test_graph_options_are_validated():
    assert GraphConfig().bucket(3) == 4 and GraphConfig().bucket(129) is None
    for bad, message in (({"buckets": [4, 2]}, "buckets: must be rising"), ({"mode": "always"}, "mode: must be one of"),
                         ({"min_table_pages": 0}, "min_table_pages: must be > 0"),
                         ({"mode": False}, 'YAML reads unquoted off.*quote it')):  # `mode: off` unquoted
        with pytest.raises(schema.ProfileError, match=message):
            schema.build(GraphConfig, bad, file="x.yaml", path="graphs")
    assert load("deployment", "cpu-tiny").graphs == GraphConfig()  # auto: graphs where the backend captures



def _tokens_without_waiting(ctx):
    model = _model(ctx, DOP)
    agree = []

    def step(k, batch, tokens):
        out = model.step_tokens(batch, tokens)
        logits = out.logits()
        agree.append(out.ready() and out.host().tolist() == logits.argmax(-1).tolist()
                     and out.device.tolist() == out.host().tolist())
        return logits

    served = serve(step, JOINING[:3], ctx.world_size, model.release)
    return {"served": served, "agree": agree, "replays": sum(g.replays for g in model.graphs.ops.graphs)}


def test_step_tokens_are_the_greedy_tokens_of_the_step(rank_pools):
    res = rank_pools(1).run(_tokens_without_waiting)[0]
    assert_matches(res["served"], reference(JOINING[:3]), "step_tokens")
    assert all(res["agree"]) and res["replays"] > 0  # replayed steps and eager ones alike


def _captured_at_start(ctx):
    model = _model(ctx, TP)
    made = model.graphs.capture_all(max_rows_per_owner=4)
    line = model.graphs.describe()
    served = serve(lambda k, b, t: model.step(b, t), JOINING[:3], ctx.world_size, model.release)
    return {"made": made, "line": line, "served": served, "captures": model.graphs.captures,
            "replays": [g.replays for g in model.graphs.ops.graphs]}


def test_graphs_captured_at_start_up_serve_the_requests_that_come(rank_pools):
    res = rank_pools(1).run(_captured_at_start)[0]
    assert [(c["bucket"], c["why"]) for c in res["made"]] == [(1, "first"), (2, "first"), (4, "first")]
    assert "buckets 1,2,4,8,16,32,64,128 rows per owner" in res["line"] and "3 captures" in res["line"]
    assert_matches(res["served"], reference(JOINING[:3]), "captured at start-up")
    assert res["captures"] == res["made"] and sum(res["replays"]) > 0  # no capture while serving


class _Refusing(HostGraphOps):
    """Graph ops whose captures of two-row steps fail after warming up (as a kernel that reads
    a device value back to the host would)."""

    def capture(self, fn, pool, warmup=2):
        logits = fn()[0]
        if logits.shape[0] == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return super().capture(fn, pool, warmup)


def _refused(ctx):
    model = _model(ctx, TP)
    model.graphs.ops = _Refusing(model)
    first_pool = model.graphs.pool = model.graphs.ops.new_pool()
    with pytest.warns(UserWarning, match="bucket 2 failed, its steps run eagerly"):
        served = serve(lambda k, b, t: model.step(b, t), JOINING[:3], ctx.world_size, model.release)
    return {"served": served, "summary": model.graphs.summary(), "captures": model.graphs.captures,
            "fresh_pool": model.graphs.pool is not first_pool}


def test_a_bucket_that_cannot_be_captured_runs_eagerly(rank_pools):
    res = rank_pools(1).run(_refused)[0]
    assert_matches(res["served"], reference(JOINING[:3]), "refused")
    [why] = res["summary"]["failed"]  # the cause's first line, and where it was raised
    assert why.startswith("RuntimeError: operation not permitted when stream is capturing at ") and \
        why.endswith(f"test_decode_graphs.py:{_Refusing.capture.__code__.co_firstlineno + 3}"), why
    assert res["fresh_pool"]  # a failed capture may leave its pool recording
    assert {c["bucket"] for c in res["captures"] if not c["why"].startswith("failed")} >= {1, 4}
