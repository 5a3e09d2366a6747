"""LSE merge and page pack/unpack in Triton's interpreter, and the kernel config's checks."""

from __future__ import annotations

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch

from splash_core.kernels import AttentionTile, MLAKernelConfig, triton_mla_kernels
from splash_core.reference import mla as ref


def test_merge_matches_reference_including_empty_parts():
    g = torch.Generator().manual_seed(0)
    outs = torch.randn(3, 4, 2, 40, generator=g, dtype=torch.float32)
    lses = torch.randn(3, 4, 2, generator=g)
    lses[:, 0, 0] = float("-inf")
    lses[1, 1, :] = float("-inf")
    out, lse = triton_mla_kernels().merge(outs, lses)
    want_out, want_lse = ref.merge(outs, lses)
    torch.testing.assert_close(out, want_out)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
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


def test_tiles_must_be_powers_of_two_and_big_enough():
    with pytest.raises(ValueError, match="power of two"):
        AttentionTile(keys=24)
    with pytest.raises(ValueError, match="rows x heads"):
        AttentionTile(rows=1, heads=8)
    with pytest.raises(ValueError, match="keys must be >= 16"):
        AttentionTile(keys=8)


def test_shared_memory_limit_names_the_tile():
    config = MLAKernelConfig(name="big", decode=AttentionTile(keys=128, stages=4), shared_memory_bytes=64 * 1024)
    with pytest.raises(ValueError, match="decode tile r1h16k128w4s4 needs about"):
        config.validate(512, 64, 2)


def test_splits_fill_the_device_but_keep_long_ranges():
    config = MLAKernelConfig(name="t", processors=132, programs_per_processor=2, max_splits=64, min_keys_per_split=256)
    assert config.splits(rows=1, heads=128, max_keys=131072) == 33  # 8 head blocks, 264 programs wanted
    assert config.splits(rows=64, heads=128, max_keys=131072) == 1  # 512 programs already
    assert config.splits(rows=1, heads=128, max_keys=1024) == 4  # no split below 256 keys


def test_config_round_trips_through_a_dict():
    config = MLAKernelConfig(name="x", extend=AttentionTile(rows=4, heads=16, keys=64, warps=8),
                             launch_options=(("waves_per_eu", 1),))
    assert MLAKernelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown MLAKernelConfig keys"):
        MLAKernelConfig.from_dict({**config.to_dict(), "blocks": 3})
