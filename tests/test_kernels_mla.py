"""Triton MLA attention (decode and extend) against the torch reference, in Triton's
interpreter on CPU. fp16/fp32 only: the interpreter computes bf16 dots wrongly (docs/design.md §6);
bf16 is checked on the GPU by bench/gpu_kernels.py. Every backend's tile config runs here,
and every kernel variant (key tile inside a page or spanning pages, value split, row blocks,
one or several splits)."""

from __future__ import annotations

import dataclasses

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch

from splash_core.kernels import AttentionTile, MLAKernelConfig, TileRule, triton_mla_kernels
from splash_core.kernels.attention import plan
from splash_core.reference import mla as ref
from splash_core.testing.mla_inputs import decode_case, extend_case, scaled_fp8_case, tolerance

CPU = torch.device("cpu")


def _backend_configs():
    from splash_backend_cuda import configs as cuda
    from splash_backend_dcu import configs as dcu
    from splash_backend_hopper import tuned

    return {"cuda-generic": cuda.GENERIC, "cuda-small": cuda.SMALL, "b200": cuda.B200,
            "h200": tuned.load()[0], "rocm": dcu.config_for("gfx936", 80)}


def _check(got, want, dtype):
    (out, lse), (ref_out, ref_lse) = got, want
    atol, rtol = tolerance(dtype)
    empty = torch.isneginf(ref_lse)
    assert (~empty).any()  # a case where no row sees a key would compare no lse at all
    assert torch.equal(torch.isneginf(lse), empty)
    assert torch.all(out[empty] == 0)
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=atol, rtol=rtol)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=atol, rtol=rtol)
    assert out.dtype == ref_out.dtype and lse.dtype == torch.float32


def _plan(kernels, entry, case):
    """(tile, splits) the entry point uses for this case (the planner the call itself uses)."""
    q, cache, table, *_, v_dim = case
    fn = getattr(kernels, entry)
    return plan(fn.keywords["config"], entry, fn.keywords["plans"], q.shape[0], q.shape[1], table.shape[0],
                table.shape[1], cache.shape[1], v_dim, q.shape[2], q.element_size())


def _run(config, entry, case, dtype, *, splits_more_than=0):
    kernels = triton_mla_kernels(config)
    _check(getattr(kernels, entry)(*case), ref.attention(*case), dtype)
    tile, splits = _plan(kernels, entry, case)
    assert splits > splits_more_than, (entry, tile.label(), splits)
    return tile


def _short_keys(config):
    """The config with 16-key tiles everywhere: the test cases hold at most 150 keys, too few to
    split a 64-key tile, and the merge must run for every backend's other tile parameters."""
    def short(tile):
        return dataclasses.replace(tile, keys=16)

    return dataclasses.replace(config, decode=short(config.decode), extend=short(config.extend),
                               rules=tuple(dataclasses.replace(r, tile=short(r.tile)) for r in config.rules))


@pytest.mark.parametrize("name", ["cuda-generic", "cuda-small", "b200", "h200", "rocm"])
def test_backend_tiles_match_reference_at_mla_dims(name):
    """Each backend's tiles at d_c 512 + d_r 64 (two dots, non-power-of-two width), with
    shuffled pages, a CP-style request, an empty request and interleaved extend rows, as
    configured; then with 16-key tiles, many processors and short splits, so both entry points
    split and the merge runs too. The head counts of the config's rules reach their tiles (at
    most three splits: the interpreter's time grows with the programs)."""
    config = _backend_configs()[name]
    split = dataclasses.replace(_short_keys(config), processors=512, min_keys_per_split=16, max_splits=3)
    for entry, make in (("decode", decode_case), ("extend", extend_case)):
        for heads in sorted({16, *(rule.min_heads for rule in config.rules if rule.entry == entry)}):
            case = make(CPU, torch.float16, heads=heads)
            assert _run(config, entry, case, torch.float16) == config.tile(entry, heads)
            tile = _run(split, entry, case, torch.float16, splits_more_than=1)
            assert tile == split.tile(entry, heads)


# (tile, page size): a key tile inside one page at its start or middle (scalar page lookup),
# one spanning several pages (per-key lookup), two value parts, row blocks of several rows.
VARIANTS = [
    (AttentionTile(rows=1, heads=16, keys=16, stages=3), 32),
    (AttentionTile(rows=1, heads=16, keys=32, stages=2), 4),
    (AttentionTile(rows=1, heads=16, keys=16, value_split=2), 16),
    (AttentionTile(rows=4, heads=16, keys=16, value_split=2, stages=4), 8),
    (AttentionTile(rows=4, heads=4, keys=16, stages=1), 64),
]


@pytest.mark.parametrize("tile,page", VARIANTS, ids=[f"{t.label()}-page{p}" for t, p in VARIANTS])
def test_kernel_variants_fp32_one_and_several_splits(tile, page):
    """float32 (exact dots) at small dims, 3 heads (a partial head block), a hole (-1) among
    request 0's pages, the same tile for both entry points, unsplit and split."""
    for processors in (1, 64):
        config = MLAKernelConfig(name="t", decode=tile, extend=tile, processors=processors, max_splits=3,
                                 min_keys_per_split=8)
        for entry, make in (("decode", decode_case), ("extend", extend_case)):
            case = make(CPU, torch.float32, heads=3, dims=(32, 16), page=page, seed=processors)
            case[2][0, 1] = -1
            _run(config, entry, case, torch.float32, splits_more_than=0 if processors == 1 else 1)


def test_rules_pick_the_tile_by_head_count():
    wide = AttentionTile(rows=1, heads=16, keys=16, value_split=2, resident=1)
    config = MLAKernelConfig(name="t", decode=AttentionTile(keys=16), rules=(TileRule("decode", 8, wide),))
    kernels = triton_mla_kernels(config)
    for heads, want in ((4, config.decode), (8, wide), (24, wide)):
        case = decode_case(CPU, torch.float32, heads=heads, dims=(32, 16))
        _check(kernels.decode(*case), ref.attention(*case), torch.float32)
        assert _plan(kernels, "decode", case)[0] == want


def test_fp8_cache_widens_to_the_query_dtype():
    q, cache, *rest = decode_case(CPU, torch.float16, heads=4, dims=(64, 16))
    case = (q, cache.to(torch.float8_e4m3fn), *rest)
    _check(triton_mla_kernels().decode(*case), ref.attention(*case), torch.float16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dims, groups, tile, page", [
    ((512, 64), 4, AttentionTile(rows=1, heads=16, keys=16, value_split=2), 16),  # DeepSeek's 656 bytes
    ((64, 16), 1, AttentionTile(rows=4, heads=4, keys=32, stages=2), 8),  # tiles spanning pages, row blocks
    ((32, 16), 4, AttentionTile(rows=1, heads=16, keys=16, stages=3), 32),
])
def test_scaled_fp8_cache_is_dequantized_inside_the_kernels(dtype, dims, groups, tile, page):
    """A uint8 scaled-fp8 cache (e4m3 latent x per-group float32 scales, bf16 rotary key): both
    entry points, unsplit and split, give the reference's attention over the dequantized keys."""
    for processors in (1, 64):
        config = MLAKernelConfig(name="t", decode=tile, extend=tile, processors=processors, max_splits=3,
                                 min_keys_per_split=8)
        kernels = triton_mla_kernels(config)
        for entry, make in (("decode", decode_case), ("extend", extend_case)):
            case = scaled_fp8_case(make(CPU, dtype, heads=3, dims=dims, page=page, seed=processors), groups)
            assert case[1].dtype == torch.uint8 and case[1].shape[2] == dims[0] + 4 * groups + 2 * dims[1]
            _check(getattr(kernels, entry)(*case), ref.attention(*case), dtype)


def test_scaled_fp8_cache_of_an_impossible_width_is_refused():
    q, cache, *rest = scaled_fp8_case(decode_case(CPU, torch.float16, heads=2, dims=(32, 16)), 2)
    with pytest.raises(ValueError, match="scales do not split the 32 latent channels"):
        triton_mla_kernels().decode(q, cache[..., :-12], *rest)  # 3 scales' bytes and 2 rotary bytes short


def test_empty_inputs_and_bad_shapes():
    kernels = triton_mla_kernels()
    q, cache, table, index, rows, pos, scale, v_dim = decode_case(CPU, torch.float16, heads=2, dims=(32, 16))
    out, lse = kernels.decode(q[:0], cache, table, index, rows[:0], pos[:0], scale, v_dim)
    assert out.shape == (0, 2, 32) and lse.shape == (0, 2)
    with pytest.raises(ValueError, match="share W"):
        kernels.decode(q[..., :40], cache, table, index, rows, pos, scale, v_dim)
    with pytest.raises(ValueError, match="v_dim"):
        kernels.decode(q, cache, table, index, rows, pos, scale, 48)
    with pytest.raises(ValueError, match="unit channel stride"):
        kernels.decode(q, cache.transpose(1, 2).contiguous().transpose(1, 2), table, index, rows, pos, scale, v_dim)
    split = triton_mla_kernels(MLAKernelConfig(name="t", decode=AttentionTile(value_split=2)))
    q, cache, table, index, rows, pos, scale, v_dim = decode_case(CPU, torch.float16, heads=2, dims=(16, 16))
    with pytest.raises(ValueError, match="value_split 2 leaves fewer than 16 value columns"):
        split.decode(q, cache, table, index, rows, pos, scale, v_dim)


def test_row_blocks_cover_every_row_once():
    """Extend's device-side grouping: blocks hold rows of one request, every row exactly once."""
    from splash_core.kernels.attention import _row_blocks

    req = torch.tensor([2, 0, 2, 2, 1, 0, 2, 2, 2], dtype=torch.int32)
    order, start, length, capacity = _row_blocks(req, requests=3, rows_per_block=2)
    seen = []
    for s, n in zip(start.tolist(), length.tolist()):
        rows = order[s:s + n].tolist() if n else []
        assert n <= 2 and len({req[r].item() for r in rows}) <= 1
        seen += rows
    assert sorted(seen) == list(range(len(req))) and capacity >= int((length > 0).sum())
