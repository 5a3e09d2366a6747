"""LSE merge and page pack/unpack in Triton's interpreter, and the kernel config's checks,
tile table and split model."""

from __future__ import annotations

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch

from splash_core.kernels import AttentionTile, MLAKernelConfig, TileRule, triton_mla_kernels
from splash_core.reference import mla as ref


@pytest.mark.parametrize("parts,dim", [(3, 40), (70, 200)])
def test_merge_matches_reference_including_empty_parts(parts, dim):
    """Few parts in one column block; more parts than one part block (64) over several
    column blocks."""
    g = torch.Generator().manual_seed(parts)
    outs = torch.randn(parts, 4, 2, dim, generator=g, dtype=torch.float32)
    lses = torch.randn(parts, 4, 2, generator=g)
    lses[:, 0, 0] = float("-inf")
    lses[1, 1, :] = float("-inf")
    lses[parts - 1, 2, 1] = 30.0  # one part dominates, the rest underflow to weight 0
    out, lse = triton_mla_kernels().merge(outs, lses)
    want_out, want_lse = ref.merge(outs, lses)
    torch.testing.assert_close(out, want_out)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse)) and (~torch.isneginf(lse)).any()
    torch.testing.assert_close(lse[~torch.isneginf(lse)], want_lse[~torch.isneginf(want_lse)])
    assert torch.all(out[0, 0] == 0)


def test_pack_unpack_round_trip_in_blocks_smaller_than_a_page():
    kernels = triton_mla_kernels(MLAKernelConfig(name="t", copy_block=64))
    cache = torch.randn(10, 4, 48, dtype=torch.float16)
    buf = kernels.pack(cache, torch.tensor([3, 7, 1]))
    assert torch.equal(buf, ref.pack(cache, torch.tensor([3, 7, 1])))
    mine, theirs = cache.clone(), cache.clone()
    kernels.unpack(mine, torch.tensor([0, 9, 5]), buf.float())  # converts to the cache dtype
    ref.unpack(theirs, torch.tensor([0, 9, 5]), buf.float())
    assert torch.equal(mine, theirs)
    assert kernels.pack(cache, torch.tensor([], dtype=torch.long)).shape == (0, 4, 48)
    with pytest.raises(ValueError, match="unpack buffer"):
        kernels.unpack(mine, torch.tensor([0]), buf)
    with pytest.raises(ValueError, match="pages are contiguous"):
        kernels.pack(cache.transpose(0, 1), torch.tensor([0]))


def test_pack_into_a_given_buffer():
    """``out=``: the pages land in the given rows (a transfer buffer's slot), nothing else changes."""
    kernels = triton_mla_kernels(MLAKernelConfig(name="t", copy_block=64))
    cache, pages = torch.randn(10, 4, 48, dtype=torch.float16), torch.tensor([3, 7, 1])
    for pack in (kernels.pack, ref.pack):
        slots = torch.full((3, 3, 4, 48), -1.0, dtype=torch.float16)
        assert pack(cache, pages, out=slots[1]).data_ptr() == slots[1].data_ptr()
        assert torch.equal(slots[1], cache[pages]) and bool((slots[0] == -1).all() and (slots[2] == -1).all())
    with pytest.raises(ValueError, match="pack out="):
        kernels.pack(cache, pages, out=torch.empty(2, 4, 48, dtype=torch.float16))


def test_tiles_must_be_powers_of_two_and_big_enough():
    with pytest.raises(ValueError, match="power of two"):
        AttentionTile(keys=24)
    with pytest.raises(ValueError, match="rows x heads"):
        AttentionTile(rows=1, heads=8)
    with pytest.raises(ValueError, match="keys must be >= 16"):
        AttentionTile(keys=8)
    with pytest.raises(ValueError, match="value_split must be 1 or 2"):
        AttentionTile(value_split=4)
    with pytest.raises(ValueError, match="resident must be >= 1"):
        AttentionTile(resident=0)
    assert AttentionTile(heads=64, value_split=2, resident=1).label() == "r1h64k32w4s2v2p1"


def test_shared_memory_limit_names_the_tile():
    config = MLAKernelConfig(name="big", decode=AttentionTile(keys=128, stages=4), shared_memory_bytes=64 * 1024)
    with pytest.raises(ValueError, match="decode tile r1h16k128w4s4p2 needs about"):
        config.validate(512, 64, 2)
    wide = TileRule("decode", 64, AttentionTile(heads=64, keys=64, stages=4))
    with pytest.raises(ValueError, match=r"decode \(heads >= 64\) tile r1h64k64w4s4p2 needs about"):
        MLAKernelConfig(name="wide", rules=(wide,), shared_memory_bytes=232448).validate(512, 64, 2)


def test_rules_choose_tiles_by_head_count():
    mid, wide = AttentionTile(heads=32), AttentionTile(heads=64, resident=1)
    config = MLAKernelConfig(name="t", rules=(TileRule("decode", 64, wide), TileRule("decode", 32, mid),
                                              TileRule("extend", 128, wide)))
    assert [config.tile("decode", h) for h in (8, 16, 32, 48, 64, 128)] == [config.decode] * 2 + [mid] * 2 + [wide] * 2
    assert config.tile("extend", 64) == config.extend and config.tile("extend", 128) == wide
    with pytest.raises(ValueError, match="two rules for decode at min_heads 64"):
        MLAKernelConfig(name="t", rules=(TileRule("decode", 64, wide), TileRule("decode", 64, mid)))
    with pytest.raises(ValueError, match="entry must be one of"):
        TileRule("prefill", 64, wide)


def test_splits_fill_one_wave_of_resident_programs():
    """Equal-length requests: split until the programs fill processors x resident slots
    once (not a second, nearly empty wave); none when the rows fill them already."""
    config = MLAKernelConfig(name="t", processors=132, max_splits=256, min_keys_per_split=256)
    tile = AttentionTile(keys=64, resident=2)  # 264 slots
    merge = 0.9  # partial bytes per program in key tiles (16 heads x 512 float32, 64 x 576 bf16 keys)
    assert config.splits(tile, programs=16, max_keys=32768, partial_tiles=merge) == 16  # 256 programs
    assert config.splits(tile, programs=64, max_keys=131072, partial_tiles=merge) == 4
    assert config.splits(tile, programs=256, max_keys=131072, partial_tiles=merge) == 1
    assert config.splits(tile, programs=1, max_keys=131072, partial_tiles=merge) == 256
    assert config.splits(tile, programs=1, max_keys=1024, partial_tiles=merge) == 4  # >= 256 keys each
    one_slot = AttentionTile(keys=64, resident=1)
    assert config.splits(one_slot, programs=16, max_keys=32768, partial_tiles=merge) == 8
    # More rows than slots: enough splits that the last wave is nearly full.
    splits = config.splits(tile, programs=300, max_keys=32768, partial_tiles=merge)
    assert 300 * splits / 264 / -(-300 * splits // 264) > 0.9


def test_config_round_trips_through_a_dict():
    config = MLAKernelConfig(name="x", extend=AttentionTile(rows=4, heads=16, keys=64, warps=8),
                             rules=(TileRule("decode", 64, AttentionTile(heads=64, value_split=2, resident=1)),),
                             launch_options=(("waves_per_eu", 1),))
    assert MLAKernelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown MLAKernelConfig keys"):
        MLAKernelConfig.from_dict({**config.to_dict(), "blocks": 3})
