"""KDA layers: the layout-free math against one full recurrence, and tiny-hybrid (KDA + MLA) in
every layout against the single-process reference.

1. One request's rows fed as chunked prefill then decode steps (mixed in with other requests,
   so steps use both the padded chunk kernel and the step kernel) give the same outputs, final
   state and conv cache as one convolution over the whole sequence (``F.conv1d``) and one
   recurrence over all tokens: the reference kernel, and fla's ``naive_recurrent_kda`` with
   fla's ``naive_kda_gate`` where fla is installed.
2. On T = 1..4 gloo ranks: chunked prefill of unequal prompts, then 22 greedy tokens, with idle
   ranks, in every layout and a per-layer mix: logits within fp32 tolerance of the reference,
   identical on every rank, the same tokens; after every step each KDA layer holds exactly its
   layout's recurrent heads, its recurrent and projection bytes equal ``ownership.footprint``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from splash_bench.driver import Prompt, generate
from splash_core.layouts import DIRECTIONS, Layout, State
from splash_core.model.kda import KDAMath, KDAWeights
from splash_core.model.weights import SeededWeights
from splash_core.planning import ownership
from splash_core.platform.interfaces import KDAKernels
from splash_core.profiles.loader import load
from splash_core.reference import kda as reference_kda
from splash_core.runtime.kda_layer import KDALayer
from splash_core.runtime.kda_recurrence import DeviceRowPlan, RowPlan, recur
from splash_core.runtime.model import Model
from splash_core.runtime.recurrent_pool import LayerRecurrent, RecurrentFormat
from splash_core.runtime.reference_model import ReferenceModel

PAGE, CHUNK, NEW_TOKENS, SEED = 16, 16, 22, 3
TP, DP, DOP, CP = Layout.TP, Layout.DP, Layout.DOP, Layout.CP
PROFILE = load("model", "tiny-hybrid")  # layers [kda, mla, kda, mla], 12 KDA heads of 16


# ---- 1. the math: chunked prefill + decode == one full recurrence ------------------------

def _fla_naive():
    try:
        from fla.ops.kda.gate import naive_kda_gate
        from fla.ops.kda.naive import naive_recurrent_kda
    except Exception as exc:  # fla (or einops) absent: CI does not install it
        pytest.skip(f"fla-core not importable: {exc}")
    return naive_recurrent_kda, naive_kda_gate


def _one_full_recurrence(w: KDAWeights, m: KDAMath, x: torch.Tensor, recurrence, gate):
    """Kimi-Linear's layer for one whole sequence, from zero state: o [n, H, V], state, last inputs."""
    n, H, K = x.shape[0], m.heads, m.head_dim
    pre = torch.stack([x @ p.t() for p in (w.q, w.k, w.v)])  # [3, n, H K]
    acts = []
    for j in range(3):
        taps = w.conv[:, j].reshape(H * K, 1, m.conv_size)
        out = F.conv1d(pre[j].t()[None], taps, padding=m.conv_size - 1, groups=H * K)[0, :, :n]
        acts.append(F.silu(out.t()).view(n, H, K))
    q, k = (F.normalize(t, dim=-1, eps=0.0) for t in acts[:2])  # |t| >> 1e-6: same as fla's l2norm
    f = ((x @ w.f_a.t()) @ w.f_b.t()).view(n, H, K)
    g = gate(f, w.a_log, w.dt_bias)
    beta = torch.sigmoid(x @ w.b.t())
    zero = torch.zeros(1, H, K, K)
    o, state = recurrence(q[None], k[None], acts[2][None], g[None], beta[None], zero, m.scale)
    history = F.pad(pre, (0, 0, m.conv_size - 1, 0))  # a short sequence leaves zeros in the cache
    return o[0], state[0], history[:, -(m.conv_size - 1):]


def _reference_gate(f, a_log, dt_bias):
    return -a_log.exp()[:, None] * F.softplus(f + dt_bias.view(f.shape[1:]))


def _runtime_chunks(w, m, xs, schedule, kernels):
    """Feed requests' rows by ``schedule`` (per step: rows per request) through the pool and
    :func:`recur`; returns each request's outputs [n, H, V] and the pool."""
    fmt = RecurrentFormat(m.heads, m.head_dim, m.head_dim, m.conv_size - 1, torch.float32)
    pool = LayerRecurrent(0, fmt, "cpu")
    fed = [0] * len(xs)
    outs = [[] for _ in xs]
    heads = range(m.heads)
    for rows in schedule:
        ids = [i for i, r in enumerate(rows) if r]
        for i in ids:
            if fed[i] == 0:
                pool.admit(i, heads)
        x = torch.cat([xs[i][fed[i]: fed[i] + rows[i]] for i in ids])
        plan = DeviceRowPlan(RowPlan(np.array([rows[i] for i in ids]), m.conv_size - 1), "cpu")
        o = recur(kernels, m, pool, ids, plan, heads, w.conv, m.inputs(w, x), m.decay(w, x), m.beta(w, x))
        at = 0
        for i in ids:
            outs[i].append(o[at: at + rows[i]])
            at, fed[i] = at + rows[i], fed[i] + rows[i]
    return [torch.cat(o) for o in outs], pool


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")  # fla on a CPU-only host
@pytest.mark.parametrize("oracle", ["reference", "fla-naive"])
def test_chunked_prefill_then_decode_equals_one_full_recurrence(oracle):
    if oracle == "fla-naive":
        recurrence, gate = _fla_naive()
        recurrence_fn = lambda q, k, v, g, b, s, scale: recurrence(  # noqa: E731
            q, k, v, g, b, scale=scale, initial_state=s, output_final_state=True)
        gate_fn = lambda f, a, d: gate(f, a, d)  # noqa: E731
    else:
        recurrence_fn, gate_fn = reference_kda.recurrent, _reference_gate
    w = KDAWeights.load(SeededWeights(SEED), PROFILE, 0)
    m = KDAMath(PROFILE)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(n, PROFILE.hidden_size, generator=gen) for n in (30, 7, 2)]
    # request 0: chunks 16, 11, then decode; request 1: 1-row chunks then a 4-row chunk; request 2
    # joins late: the steps mix the chunk kernel (padded) and the step kernel
    schedule = [(16, 1, 0), (11, 1, 0), (1, 4, 1), (1, 1, 1), (1, 0, 0)]
    kernels = KDAKernels(chunk=reference_kda.recurrent, step=reference_kda.recurrent)
    outs, pool = _runtime_chunks(w, m, xs, schedule, kernels)
    for i, x in enumerate(xs):
        o, state, last_inputs = _one_full_recurrence(w, m, x, recurrence_fn, gate_fn)
        torch.testing.assert_close(outs[i], o, rtol=1e-5, atol=1e-5)
        held = pool.get(i)
        torch.testing.assert_close(held.state, state, rtol=1e-5, atol=1e-5)
        # the conv cache holds the last c - 1 inputs of q, k and v of every head, oldest first
        want = last_inputs.view(3, -1, m.heads, m.head_dim).permute(1, 2, 0, 3)
        torch.testing.assert_close(held.conv, want, rtol=1e-5, atol=1e-5)


def test_head_shards_compute_their_heads_of_the_whole():
    """Two head shards of the weights and state give the two halves of the all-heads output."""
    full = KDAWeights.load(SeededWeights(SEED), PROFILE, 2)
    m = KDAMath(PROFILE)
    x = torch.randn(9, PROFILE.hidden_size, generator=torch.Generator().manual_seed(4))
    kernels = KDAKernels(chunk=reference_kda.recurrent, step=reference_kda.recurrent)
    whole, _ = _runtime_chunks(full, m, [x], [(9,)], kernels)
    outputs = []
    for rank in range(2):
        w = full.shard(rank, 2)
        fmt = RecurrentFormat(m.heads, m.head_dim, m.head_dim, m.conv_size - 1, torch.float32)
        pool = LayerRecurrent(2, fmt, "cpu")
        pool.admit(0, w.heads)
        plan = DeviceRowPlan(RowPlan(np.array([9]), m.conv_size - 1), "cpu")
        o = recur(kernels, m, pool, [0], plan, w.heads, w.conv[w.heads.start: w.heads.stop],
                  m.inputs(w, x), m.decay(w, x), m.beta(w, x))
        outputs.append(o)
    torch.testing.assert_close(torch.cat(outputs, dim=1), whole[0], rtol=1e-6, atol=1e-6)
    joined = KDAWeights.from_shards([full.shard(r, 3) for r in range(3)])
    assert all(torch.equal(getattr(joined, n), getattr(full, n)) for n in KDAWeights.SHARDED)
    sliced = KDAWeights.load(SeededWeights(SEED), PROFILE, 2, heads=full.shard(1, 3).heads)  # cut at load
    assert all(torch.equal(getattr(sliced, n), getattr(full.shard(1, 3), n)) for n in KDAWeights.SHARDED)


def test_missing_state_and_bad_layouts_fail_clearly():
    m = KDAMath(PROFILE)
    fmt = RecurrentFormat(m.heads, m.head_dim, m.head_dim, m.conv_size - 1, torch.float32)
    pool = LayerRecurrent(0, fmt, "cpu")
    with pytest.raises(KeyError, match="request 7 holds heads none, the step needs"):
        pool.gather([7], range(12))
    pool.admit(7, range(12))
    with pytest.raises(ValueError, match="request 7 starts but already holds heads"):
        pool.admit(7, range(12))
    with pytest.raises(ValueError, match="shards \\[0, 2\\] are not adjacent"):
        pool.assemble(7, [0, 2], 4, {})
    w = KDAWeights.load(SeededWeights(SEED), PROFILE, 0)
    with pytest.raises(ValueError, match="TP on rank 1 needs heads range\\(6, 12\\)"):
        KDALayer(0, TP, w, pool, m, None, 1, 2)


# ---- 2. tiny-hybrid in every layout against the single-process reference -----------------

def _prompt_tokens(lengths, seed):
    rng = np.random.default_rng(seed)
    return [tuple(int(t) for t in rng.integers(0, 256, n)) for n in lengths]


PROMPTS = _prompt_tokens([29, 5, 18, 1], 5)
OWNERS = {1: [0, 0, 0, 0], 2: [1, 1, 1, 1], 3: [2, 2, 0, 2], 4: [0, 3, 0, 3]}  # some rank owns nothing
MIXED = {1: (TP, DOP, CP, DP), 2: (DOP, TP, DP, CP), 3: (CP, DP, TP, DOP), 4: (DP, CP, DOP, TP)}


def _serve_all(ctx, configs, owners):
    """On each rank: serve PROMPTS in each layout config; after every step check placement and
    that each layer's bytes per state equal the ownership model's."""
    T, out = ctx.world_size, []
    for layouts in configs:
        model = Model.from_context(ctx, PROFILE, SeededWeights(SEED), list(layouts), pages_per_layer=16, page_size=PAGE)
        problems = []

        def step(batch, tokens):
            logits = model.step(batch, tokens)
            model.check_placement(batch)
            for layer in model.layers:
                want = ownership.footprint(layer.layout, batch.ownership_batch(), PROFILE, T, PAGE, layers=[layer.index])
                held = layer.nbytes()
                got = (held["projections"], held.get("recurrent", 0), held.get("kv", 0))
                expected = (want.weights[ctx.rank], want.recurrent[ctx.rank], want.kv[ctx.rank])
                if got != expected:
                    problems.append(f"layer {layer.index} at {batch.starts.tolist()}: holds {got}, model says {expected}")
            return logits

        gen = generate(step, [Prompt(i, o, p) for i, (o, p) in enumerate(zip(owners, PROMPTS))], T=T,
                       page_size=PAGE, chunk=CHUNK, new_tokens=NEW_TOKENS, release=model.release)
        left = model.nbytes()
        out.append({"gen": gen, "problems": problems, "left": (left["kv"], left["recurrent"])})
    return out


@pytest.fixture(scope="module")
def reference():
    ref = ReferenceModel(PROFILE, SeededWeights(SEED))
    return generate(ref.step, [Prompt(i, 0, p) for i, p in enumerate(PROMPTS)], T=1, page_size=PAGE,
                    chunk=CHUNK, new_tokens=NEW_TOKENS, release=ref.release)


@pytest.mark.parametrize("T", [1, 2, 3, 4])
def test_tiny_hybrid_every_layout_matches_reference(rank_pools, reference, T):
    owners = OWNERS[T]
    assert T == 1 or len(set(owners)) < T  # an idle rank still takes part in every collective
    # at T = 1 every layout computes the same way: the per-layer mix covers them
    configs = ([(layout,) * 4 for layout in Layout] if T > 1 else []) + [MIXED[T]]
    results = rank_pools(T).run(_serve_all, configs, owners)
    for c, layouts in enumerate(configs):
        label = "/".join(map(str, layouts))
        for rank, res in enumerate(r[c] for r in results):
            assert not res["problems"], f"{label} rank {rank}: {res['problems'][:2]}"
            assert res["left"] == (0, 0), f"{label} rank {rank}: state left after every request finished"
        gen = results[0][c]["gen"]
        assert len(gen.steps) == len(reference.steps) >= NEW_TOKENS
        for rank in range(1, T):
            for (ids0, l0), (ids, l) in zip(gen.steps, results[rank][c]["gen"].steps):
                assert ids == ids0 and np.array_equal(l, l0), f"{label}: rank {rank} logits differ from rank 0"
        for k, ((ids, got), (ref_ids, want)) in enumerate(zip(gen.steps, reference.steps)):
            got, want = dict(zip(ids, got)), dict(zip(ref_ids, want))
            assert got.keys() == want.keys()
            for rid in want:
                np.testing.assert_allclose(got[rid], want[rid], rtol=1e-4, atol=1e-4,
                                           err_msg=f"{label} T={T} step {k} request {rid}")
        assert gen.tokens == reference.tokens, label


# ---- 3. live switches of tiny-hybrid: the recurrent mover -------------------------------

SWITCH_AT = 4
SWITCH_OWNERS = {2: [1, 1, 1, 1, 1], 3: [0, 2, 0, 2, 2], 4: [0, 3, 2, 3, 0]}  # a rank owns nothing


def _switch_requests(T: int):
    """At the switching step: a request in decode with a long history, one mid-prefill, one
    arriving (no state yet), and one that finished the step before (released)."""
    from switch_scenarios import Req, prompt

    o = SWITCH_OWNERS[T]
    return [Req(0, o[0], prompt(37, 1), 10), Req(1, o[1], prompt(5, 2), 4), Req(2, o[2], prompt(20, 3), 8, arrives=1),
            Req(3, o[3], prompt(50, 4), 5, arrives=2), Req(4, o[4], prompt(9, 5), 5, arrives=SWITCH_AT)]


def _switch_runs(ctx, directions, mode):
    """On each rank: serve the scenario once per direction, switching every layer at step 4;
    check the state after every step."""
    from switch_scenarios import planned_bytes, serve

    from splash_core.runtime.switch import SwitchExecutor

    T, out = ctx.world_size, {}
    for src, dst in directions:
        model = Model.from_context(ctx, PROFILE, SeededWeights(SEED), src, pages_per_layer=24, page_size=PAGE)
        executor = SwitchExecutor(model, ctx)  # the default movers include the recurrent one
        problems, info = [], {}

        def step(k, batch, tokens):
            if k != SWITCH_AT:
                logits = model.step(batch, tokens)
            else:
                planned = planned_bytes(executor, dst, batch, mode, State.RECURRENT)
                logits, report = executor.step(batch, tokens, dst, mode)
                info.update(moved=report.summary()["bytes_group"].get("recurrent", 0), planned=int(planned),
                            layouts=[layer.layout for layer in model.layers])
            try:
                model.check_placement(batch)
            except AssertionError as exc:
                problems.append(f"step {k}: {exc}")
            for layer in model.layers:
                fp = ownership.footprint(layer.layout, batch.ownership_batch(), PROFILE, T, PAGE, layers=[layer.index])
                held = layer.nbytes()
                if (held["projections"], held.get("recurrent", 0)) != (fp.weights[ctx.rank], fp.recurrent[ctx.rank]):
                    problems.append(f"step {k} layer {layer.index}: holds {held}, footprint {fp}")
            return logits

        served = serve(step, _switch_requests(T), T, model.release)
        out[src, dst] = dict(served=served, problems=problems, info=info, left=model.nbytes()["recurrent"])
    return out


TP_DIRECTIONS = [(a, b) for a, b in DIRECTIONS if TP in (a, b)]  # the ones that move recurrent state


@pytest.mark.parametrize("T, mode, directions", [(2, "splash", DIRECTIONS), (4, "splash", TP_DIRECTIONS),
                                                 (3, "blocking", [(TP, DOP), (CP, TP)])])
def test_switches_keep_tokens(rank_pools, T, mode, directions):
    """All 12 directions at T = 2 (overlapped), the six that move recurrent state at T = 4, and
    two in blocking mode at T = 3."""
    from switch_scenarios import assert_matches, serve

    ref_model = ReferenceModel(PROFILE, SeededWeights(SEED))
    ref = serve(lambda k, b, t: ref_model.step(b, t), _switch_requests(T), 1, ref_model.release)
    results = rank_pools(T).run(_switch_runs, directions, mode)
    for src, dst in directions:
        label = f"T={T} {src}->{dst} {mode}"
        for rank, per_rank in enumerate(results):
            r = per_rank[src, dst]
            assert not r["problems"], f"{label} rank {rank}: {r['problems'][:3]}"
            assert r["left"] == 0, f"{label} rank {rank}: recurrent state left after every request finished"
            assert r["info"]["layouts"] == [dst] * 4, label
            assert r["info"]["moved"] == r["info"]["planned"], label
            assert (r["info"]["planned"] > 0) == (T > 1 and Layout.TP in (src, dst)), label
        assert_matches(results[0][src, dst]["served"], ref, label)
