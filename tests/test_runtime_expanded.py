"""Prefill in the expanded form (MHA over keys expanded through kv_b) beside the absorbed form:
the per-request rule, and every layout serving in each form (and in passes over the keys) equal
to the single-device reference, on T = 1..3 gloo ranks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from splash_bench.driver import Prompt, generate
from splash_core.layouts import Layout
from splash_core.model.weights import SeededWeights
from splash_core.planning.attention_forms import MLADims, expanded_requests, form_flops, pair_flops
from splash_core.profiles.loader import load
from splash_core.runtime import expanded_attention
from splash_core.runtime.model import Model
from splash_core.runtime.reference_model import ReferenceModel

V3 = MLADims(d_c=512, d_r=64, d_n=128, d_v=128)
PROMPTS = [Prompt(0, 0, tuple(range(3, 60))), Prompt(1, 1, (5, 6, 7, 8, 9)), Prompt(2, 1, tuple(range(100, 131)))]
RUN = dict(page_size=8, chunk=24, new_tokens=6)
TP, DP, DOP, CP = Layout.TP, Layout.DP, Layout.DOP, Layout.CP


def test_rule_prefers_expanded_for_long_chunks_only():
    # a chunk after a long history at DeepSeek-V3's widths: expanded wins from about 170 rows on
    assert not expanded_requests("auto", V3, [160], [65536])[0]
    assert expanded_requests("auto", V3, [180], [65536])[0]
    # a fresh chunk expands as many keys as it absorbs rows, so its pairs decide: expanded from 2 rows
    assert expanded_requests("auto", V3, [2], [2])[0]
    # a decode row never, however long its history; a long chunk after a long history does
    assert not expanded_requests("auto", V3, [1], [131072])[0]
    assert expanded_requests("auto", V3, [8192], [131072])[0]
    absorbed, expanded = form_flops(V3, np.array([1]), np.array([1]))
    assert absorbed[0] == 2 * (2 * 512 + 64) + 2 * 512 * 256 and expanded[0] == 2 * 320 + 2 * 512 * 256
    # the pairs alone (what an attention kernel computes), causal: a fresh 8K chunk has 8192 * 4096.5 of them
    absorbed, expanded = pair_flops(V3, np.array([8192]), np.array([8192]))
    assert absorbed[0] == 8192 * 4096.5 * 2176 and expanded[0] == 8192 * 4096.5 * 640
    rows, contexts = [4, 0, 1], [10, 10, 10]
    assert expanded_requests("expanded", V3, rows, contexts).tolist() == [True, False, True]
    assert not expanded_requests("absorbed", V3, rows, contexts).any()
    with pytest.raises(ValueError, match="attention form must be one of"):
        expanded_requests("mha", V3, rows, contexts)


def test_deployment_names_a_bad_form(tmp_path):
    text = "kind: deployment\nname: bad\nhardware: cpu\nmodel: tiny-mla\nT: 1\nprefill_attention: mha\n"
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(Exception, match="prefill_attention"):
        load("deployment", str(path))


def _serve(ctx, layouts, form, pass_bytes=None):
    model = Model.from_context(ctx, load("model", "tiny-mla"), SeededWeights(3), list(layouts), pages_per_layer=40,
                               page_size=RUN["page_size"], attention_form=form)
    calls = []
    inner = model.kernels.expanded

    def counted(*args):
        calls.append(args[0].shape[0])
        return inner(*args)

    model.kernels = dataclasses.replace(model.kernels, expanded=counted)
    saved = expanded_attention.PASS_BYTES
    expanded_attention.PASS_BYTES = pass_bytes or saved
    try:
        prompts = [dataclasses.replace(p, owner=p.owner % ctx.world_size) for p in PROMPTS]
        gen = generate(model.step, prompts, T=ctx.world_size, release=model.release, **RUN)
    finally:
        expanded_attention.PASS_BYTES = saved
    return gen, len(calls), model.nbytes()["kv"]


@pytest.fixture(scope="module")
def reference():
    ref = ReferenceModel(load("model", "tiny-mla"), SeededWeights(3))
    return generate(ref.step, [dataclasses.replace(p, owner=0) for p in PROMPTS], T=1, release=ref.release, **RUN)


def _same(gen, ref, label):
    assert gen.tokens == ref.tokens, label
    for (ids, got), (ids_ref, want) in zip(gen.steps, ref.steps):
        assert ids == ids_ref
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=label)


@pytest.mark.parametrize("T", [1, 2, 3])
def test_every_layout_and_form_matches_reference(rank_pools, reference, T):
    for layouts in [(l,) * 3 for l in Layout] + [(CP, TP, DOP), (DP, DOP, TP)]:
        for form in ("absorbed", "expanded", "auto"):
            results = rank_pools(T).run(_serve, layouts, form)
            label = f"{'/'.join(map(str, layouts))} {form} T={T}"
            for gen, calls, kv_left in results:
                _same(gen, reference, label)
                assert kv_left == 0, label
            calls = sum(r[1] for r in results)
            expanding = [l for l in layouts if l is not DOP]
            if form == "absorbed" or not expanding:
                assert calls == 0, label  # DOP attends absorbed: its owners hold other ranks' heads of kv_b only
            else:
                assert calls > 0, label


def test_passes_over_the_keys_give_the_same_result(rank_pools, reference):
    # one key's expanded K and V at tiny-mla's widths: 12 heads x 32 channels x 4 bytes
    for layouts in [(TP,) * 3, (CP,) * 3]:
        for gen, calls, _ in rank_pools(2).run(_serve, layouts, "expanded", 3 * 12 * 32 * 4):
            _same(gen, reference, f"{layouts} in 3-key passes")


def test_form_rows_take_consecutive_rows_as_views():
    """A prefill chunk's rows are consecutive: taken as a view and written back as a slice; rows
    that are not (two expanded requests around a decode row) by index, with the same result."""
    import torch

    row_req = np.array([0, 1, 1, 1, 2, 3, 3])
    row_pos = np.arange(7)
    x = torch.arange(7 * 2, dtype=torch.float32).view(7, 2)
    one = expanded_attention.FormRows.split(row_req, row_pos, np.array([1]), torch.device("cpu"))
    assert one.expanded_run == slice(1, 4) and one.absorbed_run is None
    taken = one.take(x, expanded=True)
    assert taken.data_ptr() == x[1].data_ptr() and torch.equal(taken, x[1:4])
    apart = expanded_attention.FormRows.split(row_req, row_pos, np.array([1, 3]), torch.device("cpu"))
    assert apart.expanded_run is None and apart.absorbed_run is None
    assert torch.equal(apart.take(x, expanded=True), x[[1, 2, 3, 5, 6]])
    assert torch.equal(apart.take(x, expanded=False), x[[0, 4]])
    for rows in (one, apart):
        out = torch.zeros_like(x)
        rows.put(out, rows.take(x, expanded=True), expanded=True)
        rows.put(out, rows.take(x, expanded=False), expanded=False)
        assert torch.equal(out, x)
    every = expanded_attention.FormRows.split(row_req, row_pos, np.array([0, 1, 2, 3]), torch.device("cpu"))
    assert every.expanded_run == slice(0, 7) and every.absorbed.numel() == 0
