"""The paged KV pool (alloc/free/pack/unpack, all-or-nothing), StepBatch metadata, and the
model's pool-full error on real ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights
from splash_core.planning import ownership
from splash_core.platform.interfaces import MLAKernels
from splash_core.profiles.loader import load
from splash_core.reference import mla as ref_mla
from splash_core.runtime.kv_pool import KVPool, LayerKV, PageFormat, held_pages
from splash_core.runtime.model import Model
from splash_core.runtime.page_keys import PoolFullError
from splash_core.runtime.step_batch import StepBatch

KERNELS = MLAKernels(decode=ref_mla.attention, extend=ref_mla.attention, merge=ref_mla.merge,
                     pack=ref_mla.pack, unpack=ref_mla.unpack)


def _layer(pages=6, dtype=torch.float32, indexer=3):
    return LayerKV(0, pages, PageFormat(4, 5, dtype, indexer, torch.float32), "cpu")


def test_alloc_free_and_tables():
    kv = _layer()
    assert kv.alloc(7, [0, 1, 2]).tolist() == [0, 1, 2]
    assert kv.alloc(9, [1, 3]).tolist() == [3, 4]  # CP-style: logical pages with gaps
    logical, physical = kv.pages_of(9)
    assert logical.tolist() == [1, 3] and physical.tolist() == [3, 4]
    assert kv.used_pages == 5 and kv.nbytes() == {"kv": 5 * 4 * 5 * 4, "indexer": 5 * 4 * 3 * 4}
    table, index = kv.block_table((9, 7, 11))
    assert table.tolist() == [[3, 4, -1], [0, 1, 2], [-1, -1, -1]]
    assert index.tolist() == [[1, 3, -1], [0, 1, 2], [-1, -1, -1]]
    with pytest.raises(ValueError, match="already holds"):
        kv.alloc(7, [2])
    assert kv.free(7, [1]) == 1 and kv.pages_of(7)[0].tolist() == [0, 2]
    assert kv.free(7) == 2 and kv.requests == [9] and kv.free_pages == 4


def test_full_pool_changes_nothing():
    kv = _layer(pages=3)
    kv.alloc(1, [0, 1])
    before = (kv.free_pages, kv.version, kv.pages_of(1)[1].tolist())
    with pytest.raises(PoolFullError, match="needs 2 pages, 1 of 3 are free"):
        kv.alloc(2, [0, 1])
    with pytest.raises(PoolFullError):
        kv.unpack(KERNELS, 2, [0, 1], torch.ones(2, 4, 5), torch.ones(2, 4, 3))
    assert (kv.free_pages, kv.version, kv.pages_of(1)[1].tolist()) == before
    assert kv.pages_of(2)[0].size == 0 and not kv.kv[2].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_write_pack_unpack_round_trip(dtype):
    src, dst = _layer(dtype=dtype), _layer(dtype=dtype)
    src.alloc(5, [0, 1])
    positions = np.arange(7)
    slots = torch.as_tensor(src.slots((5,), np.zeros(7, np.int64), positions))
    entries, keys = torch.randn(7, 5), torch.randn(7, 3)
    src.write(slots, entries, keys)
    logical, kv, idx = src.pack(KERNELS, 5)
    assert logical.tolist() == [0, 1] and kv.shape == (2, 4, 5) and kv.dtype == dtype
    dst.alloc(99, [0])  # the destination's free pages differ: unpack maps logical -> new physical
    dst.unpack(KERNELS, 5, logical, kv, idx)
    got = dst.kv.index_select(0, torch.as_tensor(dst.pages_of(5)[1])).view(-1, 5)[:7]
    assert torch.equal(got.float(), entries.to(dtype).float())
    got_keys = dst.indexer.index_select(0, torch.as_tensor(dst.pages_of(5)[1])).view(-1, 3)[:7]
    assert torch.equal(got_keys, keys)
    with pytest.raises(RuntimeError, match="beyond every held page"):
        src.slots((5,), np.array([0]), np.array([8]))
    src.alloc(6, [1])
    with pytest.raises(RuntimeError, match="request 6 writes page 0, which it holds no slot for"):
        src.slots((5, 6), np.array([0, 1]), np.array([6, 3]))


def test_pool_sizing_and_release():
    fmt = PageFormat(16, 40, torch.bfloat16, 16, torch.float8_e4m3fn)
    assert fmt.page_bytes == 16 * (40 * 2 + 16)
    assert KVPool.pages_for_budget(10 * fmt.page_bytes * 3, fmt, 3) == 10
    pool = KVPool([0, 1], 4, fmt, "cpu")
    pool[0].alloc(3, [0]), pool[1].alloc(3, [0, 1])
    assert pool.nbytes()["kv"] == 3 * fmt.kv_page_bytes
    pool.release(3)
    assert pool.nbytes() == {"kv": 0, "indexer": 0}
    with pytest.raises(KeyError, match="MLA layers"):
        pool[5]


def test_a_scaled_fp8_pool_quantizes_on_write_and_moves_bytes():
    """Scaled-fp8 pages (uint8, 64 bytes a token for d_c 32, 4 scales, d_r 8): a write stores
    the quantized entries, pack/unpack move them byte for byte, and the sizes are the format's."""
    from splash_core.model.fp8_cache import dequantize, quantize
    from splash_core.model.kv_format import ScaledFP8

    layout = ScaledFP8(32, 8, 4)
    fmt = PageFormat.scaled_fp8(4, layout, indexer_width=3)
    assert (fmt.kv_dtype, fmt.kv_width, fmt.kv_page_bytes) == (torch.uint8, 64, 4 * 64)
    with pytest.raises(ValueError, match="stores 64 bytes per token as uint8"):
        PageFormat(4, 40, torch.uint8, scaled=layout)
    src, dst = LayerKV(0, 6, fmt, "cpu"), LayerKV(0, 6, fmt, "cpu")
    src.alloc(7, [0, 1])
    entries = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)) * torch.logspace(-3, 2, 6)[:, None]
    slots = torch.as_tensor(src.slots((7,), np.zeros(6, dtype=np.int64), np.arange(6)))
    src.write(slots, entries, torch.ones(6, 3))
    stored = src.kv.view(-1, 64)[slots]
    assert torch.equal(stored, quantize(entries, layout))
    assert torch.allclose(dequantize(stored, layout), entries, rtol=2 ** -4, atol=0)
    logical, kv, idx = src.pack(KERNELS, 7)
    dst.unpack(KERNELS, 7, logical, kv, idx)
    assert torch.equal(dst.kv[torch.as_tensor(dst.pages_of(7)[1])], src.kv[torch.as_tensor(src.pages_of(7)[1])])
    assert src.nbytes() == {"kv": 2 * 4 * 64, "indexer": 2 * 4 * 3 * 4}


def test_held_pages_follow_ownership_rules():
    pages = np.arange(7)
    T = 3
    for layout in Layout:
        per_rank = [held_pages(layout, 4, 1, pages, r, T).size for r in range(T)]
        batch = ownership.Batch((ownership.Request(4, 7 * 16 - 3, 1),))
        assert per_rank == ownership.kv_pages_per_rank(layout, batch, T, 16).tolist(), layout
    assert held_pages(Layout.CP, 4, 1, pages, 1, T).tolist() == [0, 3, 6]  # (p + 4) % 3 == 1


def test_step_batch_orders_rows_owner_major():
    b = StepBatch.build([(10, 2, 0, 3), (11, 0, 5, 1), (12, 2, 17, 2), (13, 0, 0, 1)], T=4, page_size=16)
    assert b.ids.tolist() == [11, 13, 10, 12]
    assert b.owner_rows.tolist() == [2, 0, 5, 0]
    assert b.row_positions.tolist() == [5, 0, 0, 1, 2, 17, 18]
    assert b.last_rows.tolist() == [0, 1, 4, 6]
    assert b.owned_row_slice(2) == slice(2, 7) and b.owned_row_slice(1) == slice(2, 2)
    assert not b.is_decode and b.opens_pages
    # CP: page p of request i on rank (p + i) % 4 -> request 11 page 0 on 3, 10 page 0 on 2, 12 page 1 on 1
    assert b.page_holder_rows(Layout.CP, 3).tolist() == [0]
    assert b.page_holder_rows(Layout.CP, 2).tolist() == [2, 3, 4]
    assert b.page_holder_rows(Layout.DP, 2).tolist() == [2, 3, 4, 5, 6]
    first, end = b.new_pages()
    assert first.tolist() == [1, 0, 0, 2] and end.tolist() == [1, 1, 1, 2]


@pytest.mark.parametrize("bad, message", [
    ([], "at least one request"),
    ([(1, 0, 0, 1), (1, 0, 3, 1)], "unique"),
    ([(1, 2, 0, 1)], "owner 2 is not a rank"),
    ([(1, 0, 0, 0)], "rows >= 1"),
])
def test_step_batch_rejects_bad_input(bad, message):
    with pytest.raises(ValueError, match=message):
        StepBatch.build(bad, T=2, page_size=16)


def _fill_until_full(ctx):
    """DP with every request on rank 0: rank 0 runs out of pages while rank 1 has room."""
    profile = load("model", "tiny-mla")
    model = Model.from_context(ctx, profile, SeededWeights(0), Layout.DP, pages_per_layer=3, page_size=16)
    ok = StepBatch.build([(0, 0, 0, 16), (1, 0, 0, 16)], ctx.world_size, 16)
    model.step(ok, torch.zeros(32, dtype=torch.int64))
    before = [(l.free_pages, l.version, l.kv.clone()) for l in model.pool.layers.values()]
    too_big = StepBatch.build([(0, 0, 16, 16), (1, 0, 16, 1), (2, 1, 0, 5)], ctx.world_size, 16)
    try:
        model.step(too_big, torch.zeros(22, dtype=torch.int64))
        error = None
    except PoolFullError as exc:
        error = str(exc)
    after = [(l.free_pages, l.version, l.kv) for l in model.pool.layers.values()]
    unchanged = all(a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2]) for a, b in zip(after, before))
    model.release(1)  # room again: the group still works after the error
    logits = model.step(StepBatch.build([(0, 0, 16, 16), (2, 1, 0, 5)], ctx.world_size, 16),
                        torch.zeros(21, dtype=torch.int64))
    return error, unchanged, tuple(logits.shape)


def test_pool_full_raises_on_every_rank_and_writes_nothing(rank_pools):
    for rank, (error, unchanged, shape) in enumerate(rank_pools(2).run(_fill_until_full)):
        assert error and "rank 0 layer 0 needs 2 new pages, 1 free" in error and "nothing was written" in error, rank
        assert unchanged, f"rank {rank} changed its pool although the step failed"
        assert shape == (2, 256)
