"""Triton MLA attention (decode and extend) against the torch reference, in Triton's
interpreter on CPU. fp16/fp32 only: the interpreter computes bf16 dots wrongly (DESIGN.md §6);
bf16 is checked on the GPU by bench/gpu_kernels.py. Every backend's tile config runs here."""

from __future__ import annotations

import dataclasses

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch

from splash_core.kernels import AttentionTile, MLAKernelConfig, triton_mla_kernels
from splash_core.reference import mla as ref
from splash_core.testing.mla_inputs import decode_case, extend_case, paged_cache, tolerance

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
    assert torch.equal(torch.isneginf(lse), empty)
    assert torch.all(out[empty] == 0)
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=atol, rtol=rtol)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=atol, rtol=rtol)
    assert out.dtype == ref_out.dtype and lse.dtype == torch.float32


@pytest.mark.parametrize("name", ["cuda-generic", "cuda-small", "b200", "h200", "rocm"])
def test_backend_tiles_match_reference_at_mla_dims(name):
    """Each backend's tiles at d_c 512 + d_r 64 (two dots, non-power-of-two width), with
    shuffled pages, a CP-style request, an empty request and interleaved extend rows.
    Short splits make both entry points split each request's keys, so the merge runs too."""
    config = dataclasses.replace(_backend_configs()[name], processors=8, min_keys_per_split=16)
    kernels = triton_mla_kernels(config)
    for entry, case in (("decode", decode_case(CPU, torch.float16)), ("extend", extend_case(CPU, torch.float16))):
        _check(getattr(kernels, entry)(*case), ref.attention(*case), torch.float16)


def test_fp32_small_pages_spanning_tiles():
    """Pages of 4 keys under 16-key tiles (one tile gathers from four pages), odd head count,
    float32 (exact dots), one and several splits."""
    for processors in (1, 8):
        config = MLAKernelConfig(name="t", decode=AttentionTile(heads=16, keys=16),
                                 extend=AttentionTile(rows=4, heads=16, keys=16),
                                 processors=processors, min_keys_per_split=8)
        kernels = triton_mla_kernels(config)
        for entry, make in (("decode", decode_case), ("extend", extend_case)):
            case = make(CPU, torch.float32, heads=3, dims=(32, 16), page=4, seed=processors)
            _check(getattr(kernels, entry)(*case), ref.attention(*case), torch.float32)


def test_fp8_cache_widens_to_the_query_dtype():
    q, cache, *rest = decode_case(CPU, torch.float16, heads=4, dims=(64, 16))
    case = (q, cache.to(torch.float8_e4m3fn), *rest)
    _check(triton_mla_kernels().decode(*case), ref.attention(*case), torch.float16)


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
