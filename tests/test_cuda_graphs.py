"""Decode graphs on a real GPU (the backend's CUDA graphs, fused kernels and attention) at T = 1:
in every layout, the replayed decode steps give the eager steps' greedy tokens and logits while
requests join and finish between replays, the batch changes bucket, the tables widen (captured
again) and every layer's weights move to new tensors mid-generation (what a live switch does:
captured again; the old tensors are poisoned first, so a stale replay would show). And at
DeepSeek-V3's attention widths in bf16, one decode step replays to the eager step's tokens (but
for near ties).
Skipped without CUDA."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MOVE_AT = 9  # the step before which the graphed model's weights move to new tensors


def _serve(ctx, layout: str) -> dict:
    from switch_scenarios import PAGE, SEED, serve
    from test_decode_graphs import JOINING

    from splash_core.layouts import Layout
    from splash_core.model.weights import SeededWeights
    from splash_core.profiles.graphs import GraphConfig
    from splash_core.profiles.loader import load
    from splash_core.runtime.model import Model

    profile = load("model", "tiny-mla")
    models = {name: Model.from_context(ctx, profile, SeededWeights(SEED), Layout(layout), pages_per_layer=32,
                                       page_size=PAGE, graphs=graphs)
              for name, graphs in (("eager", None), ("graph", GraphConfig(min_table_pages=1)))}
    graphed = models["graph"]
    assert graphed.graphs is not None and graphed.graphs.ops is not None, "the backend must capture here"

    def move_weights():
        for layer in graphed.layers:
            w = layer.weights
            moved = dataclasses.replace(w, **{n: getattr(w, n).clone() for n in w.SHARDED})
            for n in w.SHARDED:
                getattr(w, n).fill_(float("nan"))
            layer.set_layout(layer.layout, moved)

    def step_of(name):
        def step(k, batch, tokens):
            if name == "graph" and k == MOVE_AT:
                move_weights()
            return models[name].step(batch, tokens)
        return step

    served = {name: serve(step_of(name), JOINING, 1, m.release) for name, m in models.items()}
    return {"served": served, "captures": graphed.graphs.captures, "failed": graphed.graphs.failed}


@pytest.mark.parametrize("layout", ["TP", "DP", "DOP", "CP"])
def test_replayed_decode_steps_give_the_eager_tokens(layout):
    from switch_scenarios import assert_matches

    from splash_core.runtime.spawn import RankPool

    with RankPool(1, backend="auto", timeout_s=600) as pool:
        if pool.run(_backend)[0] == "reference":
            pytest.skip("no accelerator backend installed (pip install -e backends/cuda -e backends/hopper)")
        res = pool.run(_serve, layout)[0]
    assert not res["failed"], res["failed"]
    assert_matches(res["served"]["graph"], res["served"]["eager"], layout, atol=1e-3)
    captures = res["captures"]
    assert all(c["captured"] for c in captures) and {1, 2} <= {c["bucket"] for c in captures}
    assert sum(c["why"] != "first" for c in captures) >= 2, captures  # tables widened; weights moved


def _backend(ctx) -> str:
    return ctx.backend.name


def _wide_step(ctx) -> dict:
    from splash_bench.decode_step import agreement
    from splash_core.layouts import Layout
    from splash_core.model.weights import SeededWeights
    from splash_core.profiles.graphs import GraphConfig
    from splash_core.profiles.loader import load
    from splash_core.runtime.model import Model
    from splash_core.runtime.step_batch import StepBatch, StepRequest
    from splash_core.runtime.step_timing import fill_histories

    profile, out = load("model", "deepseek-v3"), {}
    for layout in ("TP", "DP"):
        model = Model.from_context(ctx, profile, SeededWeights(0), Layout(layout), pages_per_layer=200, page_size=64,
                                   dtype=torch.bfloat16, num_layers=2, graphs=GraphConfig())
        for layer in model.paged_layers:
            layer.kv.kv.normal_()
        # no start on a page boundary: the eager and the replayed step write into the same held pages
        batch = StepBatch.build([StepRequest(i, 0, 1007 + 300 * i, 1) for i in range(5)], 1, 64)
        fill_histories(model, batch, int(batch.contexts.max()))
        tokens = torch.randint(0, profile.vocab_size, (5,), device=ctx.device)
        graphs, model.graphs = model.graphs, None
        eager = model.step(batch, tokens)
        model.graphs = graphs
        replayed = model.step(batch, tokens)
        out[layout] = {**agreement(replayed, eager), "captured": bool(graphs.captures and graphs.captures[-1]["captured"])}
    return out


def test_a_wide_bf16_decode_step_replays_to_the_eager_tokens():
    from splash_core.runtime.spawn import RankPool

    with RankPool(1, backend="auto", timeout_s=600) as pool:
        if pool.run(_backend)[0] == "reference":
            pytest.skip("no accelerator backend installed")
        res = pool.run(_wide_step)[0]
    for layout, r in res.items():  # bf16: near ties may flip, nothing else
        assert r["captured"] and not r["decisive_mismatches"], (layout, r)
        assert r["max_logit_diff"] < 2e-2 * r["logit_scale"], (layout, r)


def _serve_job(ctx, job):
    from splash_core.engine import serve

    return serve(ctx, job)


def test_a_capture_that_fails_leaves_the_run_serving_eagerly():
    """The tiny checkpoint's fp32 experts fall back to a matmul that reads counts on the host,
    which fails every capture: each bucket then decodes eagerly, later captures still work (a
    failed capture once left the allocator recording into its pool, and the next capture's
    ``empty_cache`` aborted the process), and the outputs pass the reference check."""
    import yaml

    from splash_core.engine import Job
    from splash_core.profiles.loader import builtin_root
    from splash_core.runtime.spawn import RankPool

    deployment = yaml.safe_load((builtin_root() / "deployments" / "cpu-tiny.yaml").read_text())
    deployment.update(name="gpu-tiny-moe", backend="auto", hardware="h200", T=1, memory_fraction=0.2)
    with RankPool(1, backend="auto", timeout_s=600) as pool:
        if pool.run(_backend)[0] == "reference":
            pytest.skip("no accelerator backend installed")
        summary = pool.run(_serve_job, Job(deployment, "rollout-tiny", policy="TP"))[0]
    made = summary.load["graphs"]["start_up"]
    assert made and all(c["why"].startswith("failed") for c in made), made
    assert summary.check["passed"] and summary.served == summary.requests
