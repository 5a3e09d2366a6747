"""GLM-5's shared-indexer layers hold no indexer pages (issue 37): a layer that reuses the previous
full layer's top-k never writes indexer keys, so its pages hold the latent and rotary key only, on
every rank, in every layout, and everything that sizes, plans or moves pages counts it so.

On the tiny GLM-5 checkpoint transformers writes (indexers full, shared, full, shared):

- the profile's cache bytes per token of a shared layer are a full layer's less the indexer key,
  Eq 1's k sums them per layer (a model without shared layers: count × per-layer bytes, as the
  paper), and the deployment's page bytes, its memory plan and the cost model's k agree with it;
- every switch plan (12 directions) gives shared layers no indexer plan, so the indexer bytes
  moved and held are the full layers' only, and the pages mover refuses a plan and a pool that
  disagree (a shared layer given indexer keys, or a plan moving them for a pool that has none);
- on two gloo ranks, in every layout of every layer (each shared layer in another layout than its
  full layer), the pools hold indexer tensors in the full layers only, the page bytes the ranks
  allocate are the memory plan's, the bytes in use are the ownership model's footprint, and the
  logits and greedy tokens stay transformers' (T = 2); live switches in all 12 directions with
  pages pulled rank to rank through the shared peer-memory buffer (whose per-layer offsets differ
  once layers differ in size) keep the tokens of never switching.

The checks can fail: a pool that gives a shared layer indexer keys, or whose page bytes differ
from the plan, is named by :func:`pool_problems`; the mover raises on a plan and pool that
disagree; the dense reference fails the switch comparison.
"""

from __future__ import annotations

import dataclasses
import types

import hf_checkpoints as hf
import numpy as np
import pytest
import test_checkpoint_transformers as base
import torch
from switch_scenarios import PULLS, assert_matches, serve
from test_dsa_switches import _requests, reference_run
from test_page_pulls import _OneRank
from test_runtime_kv_pool import KERNELS, _layer

from splash_bench.driver import Prompt, generate
from splash_core.checkpoint.source import CheckpointWeights
from splash_core.engine.memory_plan import deployment_memory
from splash_core.layouts import DIRECTIONS, Layout, State
from splash_core.planning import ownership
from splash_core.planning.costmodel import CostModel
from splash_core.planning.manifest import plan_switch
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.profiles.loader import load
from splash_core.reference import peer_memory
from splash_core.runtime.kv_pool import KVPool, LayerKV, PageFormat
from splash_core.runtime.model import Model
from splash_core.runtime.switch import Mode, SwitchExecutor
from splash_core.runtime.switch.pages_mover import PagesMover

FULL, SHARED = (0, 2), (1, 3)
MIXED = {"DP,TP,DOP,CP": (Layout.DP, Layout.TP, Layout.DOP, Layout.CP),
         "CP,DOP,TP,DP": (Layout.CP, Layout.DOP, Layout.TP, Layout.DP)}


@pytest.fixture(scope="module")
def glm5(tmp_path_factory):
    """(folder, transformers' (tokens, float32 logits) per prompt)."""
    folder = tmp_path_factory.mktemp("glm5-pages")
    model = hf.write_dsa("glm5-shared", folder, seed=5)
    return str(folder), [hf.greedy(model, p, base.NEW) for p in base.PROMPTS]


def deployment_of(folder: str, T: int = 2):
    """The folder's deployment (fp32 pages, sparse attention), pages pulled rank to rank."""
    return load("deployment", {**base._deployment(folder, T), "transfer": dataclasses.asdict(PULLS)})


def all_full(profile):
    """The same model with an indexer in every layer (what the pools held before)."""
    return dataclasses.replace(profile, indexer=dataclasses.replace(profile.indexer, shared_layers=()))


def test_bytes_per_token_count_indexer_keys_only_where_stored(glm5):
    profile = profile_from_checkpoint(glm5[0])
    assert profile.indexer.shared_layers == SHARED
    assert [profile.stores_indexer_keys(i) for i in range(4)] == [True, False, True, False]
    kv, idx = profile.kv_bytes_per_token_layer, profile.indexer_bytes_per_token_layer
    assert kv > 0 and idx > 0
    assert [profile.cache_bytes_per_token_at(i) for i in range(4)] == [kv + idx, kv, kv + idx, kv]
    assert profile.kv_bytes_per_token == 4 * kv + 2 * idx
    assert all_full(profile).kv_bytes_per_token == 4 * (kv + idx)  # Eq 1 as the paper: count × per-layer bytes
    deployment = deployment_of(glm5[0])
    assert deployment.kv_page_bytes == deployment.page_size * (4 * kv + 2 * idx)
    plan = deployment_memory(deployment)
    assert {m.page_bytes for m in plan.layouts} == {int(deployment.kv_page_bytes)}
    hw = load("hardware", "h200-paper")
    assert CostModel(profile, hw, 2, page_size=16).kv_bytes_token == pytest.approx(4 * kv + 2 * idx, rel=1e-12)
    assert CostModel(all_full(profile), hw, 2, page_size=16).kv_bytes_token == 4 * (kv + idx)


def test_switch_plans_give_shared_layers_no_indexer_keys(glm5):
    profile = profile_from_checkpoint(glm5[0])
    batch = ownership.Batch((ownership.Request(0, 45, 0), ownership.Request(1, 20, 1), ownership.Request(2, 7, 1)))
    for src, dst in DIRECTIONS:
        ours, before = (plan_switch(src, dst, batch, p, 2, 16) for p in (profile, all_full(profile)))
        for layer in ours.layers:
            assert (State.INDEXER in layer.states) == (layer.index in FULL), (src, dst, layer.index)
            assert layer.states[State.KV] is ours.layers[0].states[State.KV]  # one page plan, as before
        kv, indexer = (ours.fetched_bytes(s) for s in (State.KV, State.INDEXER))
        np.testing.assert_array_equal(kv, before.fetched_bytes(State.KV))
        np.testing.assert_array_equal(2 * indexer, before.fetched_bytes(State.INDEXER))
        rows = {row["state"]: row["layers"] for row in ours.summary()}
        assert rows[State.KV] == 4 and rows[State.INDEXER] == 2
        for footprint, old in ((ours.source, before.source), (ours.dest, before.dest)):
            np.testing.assert_array_equal(2 * footprint.indexer, old.indexer)
            np.testing.assert_array_equal(footprint.kv, old.kv)
        assert (ours.peak <= before.peak).all()
    moving = plan_switch(Layout.DP, Layout.TP, batch, profile, 2, 16)
    assert moving.fetched_bytes(State.INDEXER).sum() > 0  # the comparisons above compared something


def test_the_pages_mover_refuses_a_plan_and_a_pool_that_disagree(glm5):
    """Planted faults: a shared layer given indexer keys, or a plan moving keys its pool lacks."""
    profile = profile_from_checkpoint(glm5[0])
    batch = ownership.Batch((ownership.Request(0, 45, 0),))
    manifest = plan_switch(Layout.DP, Layout.TP, batch, profile, 2, 16)
    fmt = PageFormat(16, 8, torch.float32, indexer_width=4)
    with_keys, without = LayerKV(1, 4, fmt, "cpu"), LayerKV(1, 4, fmt.without_indexer(), "cpu")
    assert without.indexer is None and with_keys.indexer is not None
    for index, pool in ((1, with_keys), (0, without)):
        layer = types.SimpleNamespace(index=index, kv=pool)
        with pytest.raises(ValueError, match="disagree on indexer keys"):
            PagesMover().start(layer, dict(manifest.layer(index).states), Layout.TP, None)


def test_a_layer_without_indexer_keys_packs_and_unpacks_its_entries_only():
    full, keyless = _layer(indexer=3), _layer(indexer=0)
    assert keyless.indexer is None and full.format.indexer_page_bytes > 0
    assert keyless.format.page_bytes == full.format.page_bytes - full.format.indexer_page_bytes
    keyless.alloc(5, [0, 1])
    entries = torch.randn(7, 5)
    keyless.write(torch.as_tensor(keyless.slots((5,), np.zeros(7, np.int64), np.arange(7))), entries, None)
    logical, kv, idx = keyless.pack(KERNELS, 5)
    assert idx is None and logical.tolist() == [0, 1]
    other = _layer(indexer=0)
    other.unpack(KERNELS, 5, logical, kv)
    assert torch.equal(other.kv.index_select(0, torch.as_tensor(other.pages_of(5)[1])).view(-1, 5)[:7], entries)
    # planted: keys given to a layer that stores none, none to one that stores them; nothing allocated
    for layer, keys in ((_layer(indexer=0), torch.ones(2, 4, 3)), (_layer(indexer=3), None)):
        with pytest.raises(ValueError, match="indexer keys; unpack was given"):
            layer.unpack(KERNELS, 5, logical, kv, keys)
        assert layer.used_pages == 0


def test_a_shared_buffer_lays_out_layers_of_different_sizes(glm5):
    fmt = PageFormat(4, 3, torch.bfloat16, indexer_width=5, indexer_dtype=torch.float32)
    pool = KVPool([0, 1, 2, 3], 7, fmt, "cpu", memory=peer_memory.HostPeerMemory(_OneRank()), keyless=SHARED)
    sizes = [KVPool.layer_bytes(7, fmt if i in FULL else fmt.without_indexer()) for i in range(4)]
    assert sizes[1] < sizes[0] and pool.buffer.numel() == sum(sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for i, layer in pool.layers.items():
        assert layer.offsets[State.KV] == starts[i] == layer.kv.data_ptr() - pool.buffer.data_ptr()
        assert (State.INDEXER in layer.offsets) == (layer.indexer is not None) == (i in FULL)
        if layer.indexer is not None:
            assert layer.indexer.data_ptr() - pool.buffer.data_ptr() == layer.offsets[State.INDEXER] < starts[i + 1]
    with pytest.raises(ValueError, match="no KV pool"):
        KVPool([0, 1], 7, fmt, "cpu", keyless=(3,))


def pool_problems(pools: dict, profile, deployment) -> list[str]:
    """What a rank's pools (layer -> (holds indexer keys, page bytes)) get wrong against the profile
    and the memory plan; empty where they agree (and where there is nothing to compare: named)."""
    if not pools:
        return ["no pools"]
    out = [f"layer {i}: indexer keys {has}" for i, (has, _) in pools.items() if has != profile.stores_indexer_keys(i)]
    page = sum(nbytes for _, nbytes in pools.values())
    if page != deployment.kv_page_bytes:
        out.append(f"the ranks' page bytes {page} are not the memory plan's {deployment.kv_page_bytes}")
    return out


def _held(ctx, folder: str, forced, cases):
    """On each rank, per case: the pools, the bytes in use with the requests still held, and (rank
    0) the generation, teacher-forced with transformers' tokens."""
    deployment, out = deployment_of(folder, ctx.world_size), {}
    owners = (0, ctx.world_size - 1)
    prompts = [Prompt(i, owners[i], tuple(p)) for i, p in enumerate(base.PROMPTS)]
    for name, layouts in cases.items():
        model = Model.from_deployment(ctx, deployment, pages_per_layer=16, layouts=layouts)
        assert model.pool.buffer is not None and model.layers[1].sparse and model.layers[0].indexer is not None
        gen = generate(model.step, prompts, T=ctx.world_size, page_size=base.PAGE, chunk=base.CHUNK,
                       new_tokens=base.NEW, forced=dict(enumerate(forced)))
        pools = {i: (layer.indexer is not None, layer.format.page_bytes) for i, layer in model.pool.layers.items()}
        out[name] = (pools, model.nbytes(), gen)
    return out


def test_every_rank_holds_indexer_pages_only_in_full_layers(rank_pools, glm5):
    folder, ref = glm5
    T = 2
    deployment = deployment_of(folder, T)
    profile = deployment.model
    got = rank_pools(T).run(_held, folder, [tokens for tokens, _ in ref], MIXED)
    written = ownership.Batch(tuple(ownership.Request(i, len(p) + base.NEW - 1, (0, T - 1)[i])
                                    for i, p in enumerate(base.PROMPTS)))
    for name, layouts in MIXED.items():
        base.assert_equals_transformers(got[0][name][2], ref, 1e-4, name)
        for rank in range(T):
            pools, held, _ = got[rank][name]
            assert pool_problems(pools, profile, deployment) == [], (name, rank)
            parts = [ownership.footprint(layout, written, profile, T, base.PAGE, layers=[i])
                     for i, layout in enumerate(layouts)]
            assert held["indexer"] == sum(int(p.indexer[rank]) for p in parts) > 0, (name, rank)
            assert held["kv"] == sum(int(p.kv[rank]) for p in parts) > 0, (name, rank)
    pools = got[0]["DP,TP,DOP,CP"][0]
    planted = {**pools, 1: (True, pools[0][1])}  # a shared layer given indexer keys
    assert len(pool_problems(planted, profile, deployment)) == 2
    assert pool_problems(pools, all_full(profile), dataclasses.replace(deployment, model=all_full(profile)))
    assert pool_problems({}, profile, deployment) == ["no pools"]


def _pulled_switches(ctx, folder: str):
    """On each rank: every direction, switching at step 4 with pages pulled through peer memory."""
    profile, out = profile_from_checkpoint(folder), {}
    for src, dst in DIRECTIONS:
        model = Model.from_context(ctx, profile, CheckpointWeights(folder, profile), Layout(src), pages_per_layer=24,
                                   page_size=16, sparse_attention=True, transfer=PULLS)
        executor = SwitchExecutor(model, ctx, transfer=PULLS)
        assert model.pool.buffer is not None

        def step(k, batch, tokens):
            return model.step(batch, tokens) if k != 4 else executor.step(batch, tokens, dst, Mode.SPLASH)[0]

        out[(src, dst)] = (serve(step, _requests(), ctx.world_size, model.release),
                           [str(layer.layout) for layer in model.layers])
    return out if ctx.rank == 0 else None


def test_pulled_switches_in_every_direction_keep_the_tokens(rank_pools, glm5):
    folder = glm5[0]
    profile = profile_from_checkpoint(folder)
    want, dense = (reference_run(profile, CheckpointWeights(folder, profile), sparse) for sparse in (True, False))
    results = rank_pools(2).run(_pulled_switches, folder)[0]
    assert len(results) == 12
    for (src, dst), (served, layouts) in results.items():
        assert layouts == [dst.value] * 4, (src, dst)
        assert_matches(served, want, f"{src}->{dst}")
    with pytest.raises(AssertionError):
        assert_matches(next(iter(results.values()))[0], dense, "dense reference")
