"""The forward path's host-side shortcuts compute what the long way does: RoPE from per-step
tables, the stacked down projection, write slots shared between layers, the balanced
all-gather, views of CP's exchanged partials, the row-block cache of the attention kernel; and
``bench/runtime_host_profile.py`` (smoke) finds no per-layer host-to-device copy and no
synchronisation in a steady decode step."""

from __future__ import annotations

import dataclasses
import sys
import types

import torch
from bench_scripts import BENCH, load_bench

from splash_core import results
from splash_core.layouts import Layout
from splash_core.model.mla import MLAMath, MLAWeights, Rotary
from splash_core.model.weights import SeededWeights
from splash_core.profiles.loader import load
from splash_core.runtime import exchange
from splash_core.runtime.kv_pool import LayerKV, PageFormat
from splash_core.runtime.step_batch import StepBatch, StepRequest
from splash_core.runtime.step_context import StepContext

# The benchmark's rank-side module lives beside it; ranks find it through the path they were
# started with, and pytest imports this module before any test starts the session's pools.
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))


def test_rotary_is_the_rotate_half_formula_to_the_bit():
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 5, 1023, 70000])
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(4, 3, 16, generator=gen).to(dtype)
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
        angles = positions.float()[:, None] * inv_freq[None, :]
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        x1, x2 = x.float()[..., :8], x.float()[..., 8:]
        want = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dtype)
        rot = Rotary.at(positions, 16, 10000.0)
        assert torch.equal(rot(x), want)
        assert torch.equal(rot.rows(slice(1, 3))(x[1:3, 0]), want[1:3, 0])  # a subset of rows, no head axis


def test_stacked_down_projection_equals_one_matmul_each():
    profile = load("model", "tiny-mla")  # Q-LoRA and an indexer: three stacked blocks
    w = MLAWeights.load(SeededWeights(0), profile, 0)
    assert all(t._base is w.down for t in (w.q_a, w.kv_a, w.indexer_wk))
    x = torch.randn(5, profile.hidden_size, generator=torch.Generator().manual_seed(1))
    m = MLAMath(profile)
    for got, want in zip(m.project(w, x), m.project(dataclasses.replace(w, down=None), x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert [t.shape[1] for t in m.project(w, x)] == [32, 40, 16]


def _step(batch: StepBatch, rank: int = 0) -> StepContext:
    group = types.SimpleNamespace(size=batch.T)
    return StepContext(batch, rank, torch.device("cpu"), group, kernels=None)


def test_layers_with_equal_pages_share_one_slot_tensor():
    fmt = PageFormat(4, 8, torch.float32)
    same_a, same_b, other = (LayerKV(i, 16, fmt, "cpu") for i in range(3))
    other.alloc(99, [0])  # shifts every later physical page of this layer by one
    for kv in (same_a, same_b, other):
        kv.alloc(0, [0, 1, 2])
        kv.alloc(1, [0, 1])
    batch = StepBatch.build([StepRequest(0, 0, 9, 1), StepRequest(1, 0, 2, 4)], T=1, page_size=4)
    step = _step(batch)
    slots = [step.write_slots(kv, Layout.TP) for kv in (same_a, same_b, other)]
    assert slots[0] is slots[1] and slots[2] is not slots[0]
    for kv, got in zip((same_a, same_b, other), slots):
        want = kv.slots((0, 1), batch.row_request, batch.row_positions)
        assert got.tolist() == want.tolist()
    assert slots[0].tolist() != slots[2].tolist()


def _gather(ctx, owners):
    batch = StepBatch.build([StepRequest(i, o, 3, 1 + i) for i, o in enumerate(owners)], T=2, page_size=4)
    step = _step(batch, ctx.rank)
    step.collectives = ctx.collectives
    rows = torch.arange(batch.num_rows, dtype=torch.float32)[:, None] * torch.ones(1, 3)
    got = exchange.gather_rows(step, rows[step.own_rows].reshape(-1, 3, 1))
    return step.gather_index is None, torch.equal(got, rows.reshape(-1, 3, 1))


def test_gather_rows_balanced_and_padded(rank_pools):
    pool = rank_pools(2)
    assert pool.run(_gather, [0, 1, 0, 1, 1, 0])[0] == (False, True)  # 1+3+6 rows against 2+4+5: padded
    assert pool.run(_gather, [0, 1, 1, 0])[0] == (True, True)  # 1+4 rows against 2+3: no padding


def _partials(ctx, dtype):
    batch = StepBatch.build([StepRequest(i, i % 2, 8, 1) for i in range(5)], T=2, page_size=4)
    step = _step(batch, ctx.rank)
    step.collectives = ctx.collectives
    base = torch.arange(5 * 3 * 6, dtype=torch.float32).view(5, 3, 6) / 8
    out, lse = (base + 20 * ctx.rank).to(dtype), base[..., 0] - ctx.rank
    outs, lses = exchange.partials_to_owners(step, out, lse)
    mine = slice(step.own_rows.start, step.own_rows.stop)
    want_outs = torch.stack([(base + 20 * r).to(dtype)[mine] for r in range(2)])
    want_lses = torch.stack([base[..., 0][mine] - r for r in range(2)])
    return torch.equal(outs, want_outs) and torch.equal(lses, want_lses)


def test_partials_reach_their_owners_in_any_format(rank_pools):
    pool = rank_pools(2)
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):  # aligned, aligned, copied out
        assert all(pool.run(_partials, dtype)), dtype


def test_host_profile_smoke_finds_no_copy_or_sync_in_a_steady_decode(rank_pools, tmp_path):
    """This checkout measured against itself as the baseline tree: the smoke case runs, the
    baseline's ranks really import the tree's package, and a steady decode layer copies nothing
    to the device and reads nothing back."""
    bench = load_bench("runtime_host_profile")
    args = bench.parse_args(["--smoke", "--out", str(tmp_path), "--baseline-tree", str(BENCH.parent)])
    base = bench.baseline_pool(args)
    try:
        data = results.read_result(bench.run(args, rank_pools(2), base))
    finally:
        base.close()
    rows = {(r["layout"], r["phase"]): r for r in data["summary"]["points"]}
    assert set(rows) == {(str(l), p) for l in Layout for p in ("decode", "decode_open", "prefill")}
    for row in rows.values():
        assert all(row[f"before_{k}"] == row[k] for k in ("aten_ops", "host_copies", "step_copies", "host_reads"))
    for layout in Layout:
        decode = rows[str(layout), "decode"]
        assert decode["host_copies"] == 0 and decode["host_reads"] == 0, decode
        assert decode["aten_ops"] > 0 and decode["runtime_us"] > 0 and decode["step_copies"] > 0
