"""The hopper backend's FlashMLA adapter, on the CPU against a stand-in for the wheel that does
what FlashMLA's dense decode is documented to do (attend to the first ``cache_seqlens`` keys of
each row's block table): the adapter must hand it the right tables and lengths in every layout's
holdings (CP's every-T-th page, a request seeing no key), and fall back for calls FlashMLA does
not serve. The real kernel is checked against the reference on the GPU (bench/peer_kernels.py
and the conformance suite). Also: which provider the measured table picks per head count."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
from splash_backend_hopper import flashmla, providers

from splash_core.reference import mla as ref_mla
from splash_core.testing.mla_inputs import decode_case

PAGE = flashmla.PAGE


def _stand_in(calls: list):
    module = types.ModuleType("flash_mla")

    def get_mla_metadata():
        return object(), None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, *, softmax_scale,
                               causal, use_legacy):
        assert use_legacy and not causal and k_cache.shape[2] == 1 and q.shape[1] == 1
        calls.append(cache_seqlens.clone())
        b, _, h, _ = q.shape
        out = torch.zeros(b, 1, h, head_dim_v, dtype=q.dtype)
        lse = torch.full((b, h, 1), float("-inf"))
        for i in range(b):
            n = int(cache_seqlens[i])
            keys = k_cache[block_table[i].long()].reshape(-1, k_cache.shape[-1])[:n].float()
            if n == 0:
                continue
            scores = q[i, 0].float() @ keys.t() * softmax_scale
            lse[i, :, 0] = torch.logsumexp(scores, -1)
            out[i, 0] = (torch.softmax(scores, -1) @ keys[:, :head_dim_v]).to(q.dtype)
        return out, lse

    module.get_mla_metadata = get_mla_metadata
    module.flash_mla_with_kvcache = flash_mla_with_kvcache
    return module


def test_adapter_gives_flashmla_the_visible_keys_of_every_holding(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "flash_mla", _stand_in(calls))
    fallback_calls = []

    def fallback(*args):
        fallback_calls.append(args)
        return ref_mla.attention(*args)

    decode = flashmla.decode(fallback)
    case = decode_case("cpu", torch.bfloat16, heads=16, page=PAGE)  # holes, a request that sees no key
    out, lse = decode(*case)
    ref_out, ref_lse = ref_mla.attention(*case)
    assert calls and not fallback_calls
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)) and torch.isneginf(lse).any()
    seen = ~torch.isneginf(ref_lse)
    assert seen.any()
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[seen], ref_lse[seen], atol=1e-3, rtol=1e-3)
    q, cache, table, index, req, pos, scale, v = case
    expected = flashmla.visible_keys(table[req.long()], index[req.long()], pos, PAGE)
    assert torch.equal(calls[0], expected)
    # what FlashMLA does not serve goes to the fallback: fp32, another page size, another width
    decode(q.float(), cache.float(), table, index, req, pos, scale, v)
    small = decode_case("cpu", torch.bfloat16, heads=16, page=16)
    decode(*small)
    assert len(fallback_calls) == 2 and len(calls) == 1


def test_a_steps_layers_share_one_schedule_and_key_count(monkeypatch):
    """Every layer of a step passes the same row tensors: FlashMLA's schedule and the key counts
    are made once (by the first layer); a new step's tensors, or rows rewritten in place, make
    them again, and every layer's result stays the reference's."""
    calls, schedules = [], []
    module = _stand_in(calls)
    module.get_mla_metadata = lambda: (schedules.append(object()) or schedules[-1], None)
    monkeypatch.setitem(sys.modules, "flash_mla", module)
    decode = flashmla.decode(ref_mla.attention)
    q, cache, table, index, req, pos, scale, v = decode_case("cpu", torch.bfloat16, heads=16, page=PAGE)
    layers = [(cache, table), (cache.roll(1, 0), table.clone())]  # another layer: its own pages, same holdings
    for layer_cache, layer_table in layers:
        out, _ = decode(q, layer_cache, layer_table, index, req, pos, scale, v)
        torch.testing.assert_close(out.float(), ref_mla.attention(q, layer_cache, layer_table, index, req, pos,
                                                                  scale, v)[0].float(), atol=2e-2, rtol=2e-2)
    assert len(schedules) == 1 and len(calls) == 2
    decode(q, cache, table, index, req, pos.clone(), scale, v)  # the next step's tensors
    pos[0] += 1  # rewritten in place
    decode(q, cache, table, index, req, pos, scale, v)
    assert len(schedules) == 3
    assert torch.equal(calls[-1], flashmla.visible_keys(table[req.long()], index[req.long()], pos, PAGE))


def test_visible_keys_count_only_written_slots():
    table = torch.tensor([[3, 7, -1], [5, -1, -1]], dtype=torch.int32)
    index = torch.tensor([[0, 2, 0], [4, 0, 0]], dtype=torch.int32)  # rank holds pages 0 and 2 (CP-like)
    pos = torch.tensor([2 * PAGE + 9, 4 * PAGE - 1], dtype=torch.int32)  # page 2 has 10 slots; page 4 none yet
    assert flashmla.visible_keys(table, index, pos, PAGE).tolist() == [PAGE + 10, 0]


def test_measured_table_picks_the_provider_per_head_count_and_size(tmp_path):
    table = {"decode": {16: None, 64: 1 << 19, 128: 1 << 18}}
    assert [providers.decode_provider(h, 1 << 20, table) for h in (8, 16, 32, 64, 100, 128, 256)] == [
        "triton", "triton", "triton", "flashmla", "flashmla", "flashmla", "flashmla"]
    assert providers.decode_provider(128, 1 << 17, table) == "triton"  # a small call stays on Triton
    assert providers.decode_provider(128, 1 << 30, {}) == "triton"  # nothing measured: Triton everywhere
    path = tmp_path / "providers.json"
    path.write_text(json.dumps({"source": "measured", "decode": {"16": {"flashmla_from_kv_tokens": 4096}}}))
    assert providers.load(path)["decode"] == {16: 4096}
    path.write_text("{}")
    with pytest.raises(ValueError, match="providers.json: not a provider table"):
        providers.load.__wrapped__(path)
    assert providers.describe("no wheel here") == "decode: triton (no wheel here)"


def test_thresholds_start_where_flashmla_wins_every_larger_point():
    def row(kernel, batch, context, ms):
        return {"kernel": kernel, "heads": 64, "batch": batch, "context": context, "ms": ms}

    samples = [row("splash", 1, 4096, 0.06), row("flashmla", 1, 4096, 0.25),  # 4K tokens: Triton
               row("splash", 16, 4096, 0.30), row("flashmla", 16, 4096, 0.25),  # 64K: FlashMLA, but ...
               row("splash", 1, 131072, 0.12), row("flashmla", 1, 131072, 0.27),  # ... 128K: Triton again
               row("splash", 16, 32768, 0.37), row("flashmla", 16, 32768, 0.26),  # 512K: FlashMLA from here
               row("splash", 64, 131072, 5.6), row("flashmla", 64, 131072, 2.4)]
    got = providers.thresholds(samples)["64"]
    assert got["flashmla_from_kv_tokens"] == 16 * 32768 and got["points"] == 5
    assert got["flashmla_faster_at"] == [[16, 4096], [16, 32768], [64, 131072]]


def _fp8_stand_in(calls: list):
    """FlashMLA's fp8 decode as documented: sparse attention over ``indices`` (flat cache slots,
    -1 skipped) of a cache of 656-byte V3.2 entries (e4m3 latent x 4 float32 scales, bf16 rotary)."""
    from splash_core.model.fp8_cache import dequantize
    from splash_core.model.kv_format import ScaledFP8

    module = types.ModuleType("flash_mla")
    module.get_mla_metadata = lambda: (object(), None)

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, *, softmax_scale, causal,
                               is_fp8_kvcache, indices, use_legacy, kv_format):
        assert (use_legacy, is_fp8_kvcache, kv_format, causal) == (True, True, "V32", False)
        assert block_table is None and cache_seqlens is None and k_cache.dtype == torch.float8_e4m3fn
        calls.append(indices.clone())
        b, _, h, _ = q.shape
        keys_all = dequantize(k_cache.view(torch.uint8).reshape(-1, 656), ScaledFP8(512, 64, 4))
        out = torch.zeros(b, 1, h, head_dim_v, dtype=q.dtype)
        lse = torch.full((b, h, 1), float("-inf"))
        for i in range(b):
            slots = indices[i, 0][indices[i, 0] >= 0].long()
            if slots.numel() == 0:
                continue
            keys = keys_all[slots]
            scores = q[i, 0].float() @ keys.t() * softmax_scale
            lse[i, :, 0] = torch.logsumexp(scores, -1)
            out[i, 0] = (torch.softmax(scores, -1) @ keys[:, :head_dim_v]).to(q.dtype)
        return out, lse

    module.flash_mla_with_kvcache = flash_mla_with_kvcache
    return module


def test_fp8_adapter_gives_flashmla_the_visible_slots_as_sparse_indices(monkeypatch):
    """A scaled-fp8 cache (uint8, 656 bytes a token) at 64 and 128 heads goes to FlashMLA's fp8
    decode with every row's visible slots (CP holdings, a hole, a row seeing nothing) and gives the
    reference's attention; 16 heads (not built in FlashMLA's fp8 decode) go to the fallback."""
    from splash_core.testing.mla_inputs import scaled_fp8_case

    calls, fallback_calls = [], []
    monkeypatch.setitem(sys.modules, "flash_mla", _fp8_stand_in(calls))

    def fallback(*args):
        fallback_calls.append(args)
        return ref_mla.attention(*args)

    decode = flashmla.decode(fallback)
    for heads in (64, 128):
        case = scaled_fp8_case(decode_case("cpu", torch.bfloat16, heads=heads, page=PAGE), 4)
        case[2][0, 1] = -1  # a hole among request 0's pages
        out, lse = decode(*case)
        ref_out, ref_lse = ref_mla.attention(*case)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)) and torch.isneginf(lse).any()
        seen = ~torch.isneginf(ref_lse)
        assert seen.any()
        torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[seen], ref_lse[seen], atol=1e-3, rtol=1e-3)
    assert len(calls) == 2 and not fallback_calls
    decode(*scaled_fp8_case(decode_case("cpu", torch.bfloat16, heads=16, page=PAGE), 4))
    assert len(fallback_calls) == 1 and len(calls) == 2


def test_visible_slots_list_exactly_the_written_slots():
    table = torch.tensor([[3, 7, -1], [5, -1, -1]], dtype=torch.int32)
    index = torch.tensor([[0, 2, 0], [4, 0, 0]], dtype=torch.int32)
    pos = torch.tensor([2 * PAGE + 9, 4 * PAGE - 1], dtype=torch.int32)
    slots = flashmla.visible_slots(table, index, pos, PAGE)
    assert slots.shape == (2, 3 * PAGE) and slots.dtype == torch.int32
    assert slots[0, :PAGE].tolist() == list(range(3 * PAGE, 4 * PAGE))  # page 0: every slot
    assert slots[0, PAGE: PAGE + 10].tolist() == list(range(7 * PAGE, 7 * PAGE + 10))  # page 2: 10 slots written
    assert (slots[0, PAGE + 10:] == -1).all() and (slots[1] == -1).all()


def test_fp8_calls_go_by_their_own_measured_table():
    """The bf16 table says nothing of FlashMLA's fp8 decode: without a ``decode_fp8`` table every
    fp8 call stays on Triton; with one, it decides."""
    bf16_only = {"decode": {128: 1 << 10}}
    assert providers.decode_provider(128, 1 << 20, bf16_only) == "flashmla"
    assert providers.decode_provider(128, 1 << 20, bf16_only, kv="fp8") == "triton"
    both = {**bf16_only, "decode_fp8": {64: 1 << 18, 128: None}}
    assert [providers.decode_provider(h, 1 << 20, both, kv="fp8") for h in (64, 128)] == ["flashmla", "triton"]


def _sparse_stand_in(monkeypatch):
    """flash_mla's sparse prefill as documented: each row attends to the flat keys its indices
    name (-1 skipped), in blocks of 64 indices; returns (out, max_logits, lse)."""
    module = types.ModuleType("flash_mla")

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, use_legacy):
        assert use_legacy and indices.shape[-1] % flashmla.SPARSE_TOPK_MULTIPLE == 0 and kv.shape[1] == 1
        listed = indices[:, 0].long()
        keys = kv[:, 0].float()[listed.clamp(min=0)]  # [N, K, W]
        logits = torch.einsum("nhw,nkw->nhk", q.float(), keys) * sm_scale
        logits = logits.masked_fill((listed < 0)[:, None, :], float("-inf"))
        lse = torch.logsumexp(logits, -1)
        out = torch.einsum("nhk,nkv->nhv", torch.softmax(logits, -1).nan_to_num(0.0), keys[..., :d_v])
        return out.to(q.dtype), None, lse

    module.flash_mla_sparse_fwd = flash_mla_sparse_fwd
    module.flash_mla_with_kvcache = module.get_mla_metadata = None
    monkeypatch.setitem(sys.modules, "flash_mla", module)


def test_sparse_adapter_hands_flashmla_the_flat_slots_of_each_rows_selection(monkeypatch):
    """bf16, 576-wide keys, 64 heads: the adapter's flat indices pick exactly the reference's keys
    (a CP-style request, a hole, a row selecting nothing); other calls go to the fallback."""
    from splash_core.reference import dsa as ref_dsa

    _sparse_stand_in(monkeypatch)
    q, cache, table, index, rows, pos, scale, v_dim = decode_case(torch.device("cpu"), torch.bfloat16, heads=64,
                                                                  page=PAGE)
    slots = torch.tensor([[0, 5, 70, -1], [3, 1, -1, -1], [2, 64, 65, 9], [-1, -1, -1, -1]], dtype=torch.int32)
    fallbacks = []
    run = flashmla.sparse(lambda *args: fallbacks.append(args) or ref_dsa.sparse_attention(*args))
    out, lse = run(q, cache, table, rows, slots, scale, v_dim)
    want_out, want_lse = ref_dsa.sparse_attention(q, cache, table, rows, slots, scale, v_dim)
    assert not fallbacks and torch.isneginf(lse[3]).all() and (out[3] == 0).all()
    torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(out.float(), want_out.float(), atol=2e-2, rtol=2e-2)
    run(q[:, :16], cache, table, rows, slots, scale, v_dim)  # 16 heads: not FlashMLA's
    assert len(fallbacks) == 1
    flat = flashmla.flat_slots(table, rows, slots, PAGE)
    assert flat.shape == (4, 64) and (flat[:, 4:] == -1).all() and flat[0, 0] == table[0, 0] * PAGE


def test_sparse_provider_comes_from_the_measured_table():
    assert providers.sparse_provider("bf16", {}) == "triton"
    table = {"sparse": {"bf16": {"provider": "flashmla"}, "fp8": {"provider": "triton"}}}
    assert providers.sparse_provider("bf16", table) == "flashmla" and providers.sparse_provider("fp8", table) == "triton"
    phased = {"sparse": {"bf16": {"provider": "triton", "phases": {"decode": "triton", "prefill": "flashmla"}}}}
    assert [providers.sparse_provider("bf16", phased, ph) for ph in ("decode", "prefill", None)] == [
        "triton", "flashmla", "triton"]
    assert providers.sparse_provider("bf16", table, "prefill") == "flashmla"  # a table without phases: every phase
    assert providers.sparse_somewhere(phased) and not providers.sparse_somewhere({})
