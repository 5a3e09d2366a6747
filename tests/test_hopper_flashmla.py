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
