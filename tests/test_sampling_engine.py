"""The sampling options and logprobs through the engine on gloo ranks (issue 36 §3): every layout
and the switches between them, chunked prefill, a scoring-only request; every token, logprob and
prompt logprob against the single-device reference, and the comparison fails on planted faults."""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest
import torch
import yaml

from splash_core.checkpoint.deployments import resolve
from splash_core.checkpoint.source import weight_source
from splash_core.engine.admission import KVCapacity
from splash_core.engine.controller import Controller
from splash_core.engine.draws import uniform
from splash_core.engine.logprobs import news
from splash_core.engine.messages import TokenLogprob
from splash_core.engine.policy import ScriptedPolicy
from splash_core.engine.requests import Request
from splash_core.engine.steps import Hooks, build, run_steps
from splash_core.layouts import Layout
from splash_core.profiles.loader import builtin_root
from splash_core.profiles.workload import RequestSpec
from splash_core.runtime.reference_model import ReferenceModel
from splash_core.runtime.sampling import History, SamplingParams, adjust_logits, choose_rows

EVERY_LAYOUT = ScriptedPolicy((Layout.TP, Layout.DP, Layout.DOP, Layout.CP), every=2)
PRECOPIED = ScriptedPolicy((Layout.TP, Layout.DP, Layout.DOP, Layout.CP), every=3)  # switches pre-copied over 2 steps
PROMPTS = {0: (5, 9, 14, 3, 8, 5, 9), 1: (7, 7, 21, 30, 2), 2: (30, 2, 11, 19, 4, 6, 1, 11, 2), 3: (12, 40, 12),
           4: (3, 3, 3)}  # 4: greedy repeats 3 as its 4th output


@dataclasses.dataclass(frozen=True)
class Ask:
    """One request of the run: what it generates and which logprobs it wants."""

    id: int
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    logprobs: int | None = None
    prompt_logprobs: int | None = None


class _News(Hooks):
    def __init__(self, controller):
        self.controller, self.reports = controller, []

    def after_step(self, plan, produced, seconds, switch):
        self.reports.append(news(plan, produced, self.controller.requests))


def _serve(ctx, asks, chunk, deployment="cpu-tiny", policy=EVERY_LAYOUT, switch_mode="splash"):
    """Rank 0: {id: (tokens, logprobs, prompt logprobs, finish reason)}, every step's news, the
    layouts the steps ran in, and how many decode steps replayed a graph."""
    deployment = resolve(deployment)
    capacity = KVCapacity(64, deployment.page_size, deployment.T, "test")
    group = build(ctx, deployment, capacity, policy, max_rows_per_owner=len(asks))
    replays = []
    if group.model.graphs is not None:  # count the decode steps that took a graph
        run = group.model.graphs.run
        group.model.graphs.run = lambda batch, tokens: replays.append(run(batch, tokens)) or replays[-1]
    controller = hooks = None
    if ctx.rank == 0:
        requests = [Request(RequestSpec(a.id, len(PROMPTS[a.id]), a.max_new_tokens), np.array(PROMPTS[a.id]),
                            sampling=a.sampling, logprobs=a.logprobs, prompt_logprobs=a.prompt_logprobs) for a in asks]
        controller = Controller(requests, policy, capacity, concurrency=len(asks), prefill_chunk=chunk,
                                layout=policy.initial)
        hooks = _News(controller)
    ctx.collectives.barrier()
    run_steps(ctx, group, controller, switch_mode, hooks, precopy_steps=2)
    if controller is None:
        return None
    done = {r.id: (list(r.generated), list(r.token_logprobs), list(r.prompt_scores), r.finish_reason)
            for r in controller.requests.values()}
    replayed = sum(r is not None for r in replays)
    layouts = sorted({str(s.layout) for s in controller.steps})
    return done, hooks.reports, layouts, replayed, ctx.backend.name, controller.precopy_counts["begun"]


@functools.cache
def _reference(deployment: str = "cpu-tiny", device: str = "cpu") -> ReferenceModel:
    """The reference of a deployment given by name, or as JSON, on ``device`` (seeded weights are
    drawn there: the engine's device's)."""
    deployment = resolve(json.loads(deployment) if deployment.startswith("{") else deployment)
    return ReferenceModel(deployment.model, weight_source(deployment.model, deployment.seed), device, torch.float32,
                          deployment.layers)


def _cpu_tiny() -> dict:
    return yaml.safe_load((builtin_root() / "deployments" / "cpu-tiny.yaml").read_text())


def _reference_logits(prompt, generated, deployment: str = "cpu-tiny", device: str = "cpu"):
    """Logits [n, V] (on the host) of the single-device reference at every position of prompt + generated[:-1]."""
    ref = _reference(deployment, device)
    ref.release(0)
    fed = torch.tensor(list(prompt) + list(generated[:-1]), dtype=torch.int64, device=device)
    return ref.logits(ref.forward(0, 0, fed)).cpu()


def _reference_logprobs(prompt, generated):
    return torch.log_softmax(_reference_logits(prompt, generated), -1)


def _compare(entries, reference, targets, k, atol=1e-4):
    """Raise unless every entry has its target token, a finite logprob equal to the reference's
    row, and its k most likely tokens; ``entries[i]`` is scored by ``reference[i]``."""
    if not entries or len(entries) != len(reference) or len(entries) != len(targets):
        raise AssertionError(f"{len(entries)} entries for {len(reference)} reference rows and {len(targets)} targets")
    for i, (entry, row, target) in enumerate(zip(entries, reference, targets)):
        values = [entry.logprob] + [v for _, v in entry.top]
        if not np.isfinite(values).all():
            raise AssertionError(f"entry {i}: non-finite logprob {values}")
        if entry.token != target or not abs(entry.logprob - float(row[target])) <= atol:
            raise AssertionError(f"entry {i}: token {entry.token} logprob {entry.logprob}, reference token "
                                 f"{target} logprob {float(row[target])}")
        best = row.topk(k)
        if len(entry.top) != k or [t for t, _ in entry.top] != best.indices.tolist() or \
                not np.allclose([v for _, v in entry.top], best.values.tolist(), atol=atol):
            raise AssertionError(f"entry {i}: top {entry.top}, reference {best}")


def _run(rank_pools, asks, chunk=3, switch_mode="splash"):
    policy = EVERY_LAYOUT if switch_mode == "splash" else PRECOPIED
    done, reports, layouts, _, _, precopies = rank_pools(2).run(_serve, asks, chunk, "cpu-tiny", policy, switch_mode)[0]
    assert (precopies > 0) == (switch_mode == "precopy")
    return done, reports, layouts


@pytest.mark.parametrize("switch_mode", ["splash", "precopy"])
def test_logprobs_and_prompt_logprobs_equal_the_reference_in_every_layout(rank_pools, switch_mode):
    """Chunked prefill (3 rows a step) and forced switches every 2 steps through TP, DP, DOP and
    CP (in one step, or pre-copied beside the steps): a greedy request with both logprobs, a
    scoring-only one (max_new_tokens 0) and a sampled one."""
    warm = SamplingParams(temperature=0.8, seed=3)
    asks = [Ask(0, 14, logprobs=3, prompt_logprobs=2), Ask(1, 0, prompt_logprobs=0), Ask(2, 4, warm, logprobs=0)]
    done, reports, layouts = _run(rank_pools, asks, switch_mode=switch_mode)
    assert layouts == ["CP", "DOP", "DP", "TP"]
    for a in asks:
        generated, token_lps, prompt_lps, reason = done[a.id]
        prompt = PROMPTS[a.id]
        assert reason == "length" and len(generated) == a.max_new_tokens
        reference = _reference_logprobs(prompt, generated or [0])
        if a.prompt_logprobs is not None:
            _compare(prompt_lps, reference[: len(prompt) - 1], prompt[1:], a.prompt_logprobs)
            sent = [entries for r in reports for rid, entries in r["prompt_logprobs"] if rid == a.id]
            assert sent == [(None,) + tuple(prompt_lps)]  # once, after the prefill, None for position 0
        if a.logprobs is not None:
            _compare(token_lps, reference[len(prompt) - 1:], generated, a.logprobs)
            assert [e for r in reports for rid, e in r["logprobs"] if rid == a.id] == token_lps
        else:
            assert token_lps == []
        if a.max_new_tokens:
            rows = reference[len(prompt) - 1:]
            want = rows.argmax(-1) if a.sampling.greedy else choose_rows(
                rows, [a.sampling] * len(rows), [uniform(a.sampling, a.id, i) for i in range(len(rows))])
            assert generated == want.tolist()
    assert [f for r in reports for f in r["finished"]] == [(1, "length")]  # the scoring-only request's end


def test_penalties_min_p_and_min_tokens_choose_as_the_reference_does_in_every_layout(rank_pools):
    """The engine's tokens equal the reference's choice from logits adjusted by the same pure
    function over the tokens so far, for greedy and sampled penalised requests; min_tokens keeps a
    stop id (the reference's first greedy token) from ending a request before it; a huge
    repetition penalty repeats no token."""
    first = int(_reference_logits(PROMPTS[3], [0])[-1].argmax())
    asks = [Ask(4, 6, SamplingParams(repetition_penalty=1e6)),
            Ask(1, 5, SamplingParams(temperature=0.9, seed=2, presence_penalty=1.5, frequency_penalty=0.7,
                                     min_p=0.05, repetition_penalty=1.3)),
            Ask(2, 5, SamplingParams(temperature=1.1, top_k=40, frequency_penalty=-1.0, seed=5), logprobs=1),
            Ask(3, 4, SamplingParams(min_tokens=3, stop_token_ids=(first,)))]
    done, _, layouts = _run(rank_pools, asks)
    assert layouts == ["CP", "DOP", "DP", "TP"]
    for a in asks:
        generated = done[a.id][0]
        prompt = PROMPTS[a.id]
        rows = _reference_logits(prompt, generated)[len(prompt) - 1:]
        adjusted = adjust_logits(rows, [a.sampling] * len(rows), History.of(
            [prompt] * len(rows), [generated[:k] for k in range(len(rows))], rows.shape[1]))
        want = adjusted.argmax(-1) if a.sampling.greedy else choose_rows(
            adjusted, [a.sampling] * len(rows), [uniform(a.sampling, a.id, i) for i in range(len(rows))])
        assert generated == want.tolist(), a
        if a.sampling.penalized:  # not vacuous: the same check without the adjustment fails
            plain = rows.argmax(-1) if a.sampling.greedy else choose_rows(
                rows, [a.sampling] * len(rows), [uniform(a.sampling, a.id, i) for i in range(len(rows))])
            assert generated != plain.tolist(), a
    assert len(set(done[4][0])) == 6 and 3 not in done[4][0]
    assert first not in done[3][0][:3] and len(done[3][0]) >= 3


def test_the_comparison_fails_on_planted_faults():
    reference = torch.log_softmax(torch.randn(4, 30, generator=torch.Generator().manual_seed(1)), -1)
    targets = [3, 7, 1, 0]

    def entry(row, target, k=2):
        best = reference[row].topk(k)
        top = tuple(zip(best.indices.tolist(), best.values.tolist()))
        return TokenLogprob(target, float(reference[row, target]), top)

    good = [entry(i, t) for i, t in enumerate(targets)]
    _compare(good, reference, targets, 2)
    shifted = good[1:] + good[:1]
    nan = good[:2] + [dataclasses.replace(good[2], logprob=float("nan"))] + good[3:]
    inf_top = good[:3] + [dataclasses.replace(good[3], top=((0, float("-inf")), good[3].top[1]))]
    off = good[:1] + [dataclasses.replace(good[1], logprob=good[1].logprob + 1e-3)] + good[2:]
    wrong_top = [dataclasses.replace(good[0], top=good[0].top[::-1])] + good[1:]
    for bad in (shifted, nan, inf_top, off, wrong_top, [], good[:3]):
        with pytest.raises(AssertionError):
            _compare(bad, reference, targets, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_adjusted_draws_and_logprobs_ride_on_replayed_decode_steps():
    """One GPU, decode graphs captured at start-up: penalised greedy and sampled requests and
    logprobs are chosen and computed eagerly behind the replayed graph, and equal the reference."""
    from splash_core.runtime.spawn import RankPool

    # tiny-mla (a dense MLP), as tests/test_engine_overlap.py's GPU test: every decode step can replay
    deployment = {**_cpu_tiny(), "name": "gpu-tiny-sampling", "backend": "auto", "hardware": "h200", "T": 1,
                  "memory_fraction": 0.2, "model": "tiny-mla"}
    asks = [Ask(4, 8, SamplingParams(repetition_penalty=1e6), logprobs=2, prompt_logprobs=1),
            Ask(1, 8, SamplingParams(temperature=0.9, seed=2, presence_penalty=1.5, frequency_penalty=0.7, min_p=0.05),
                logprobs=0),
            Ask(3, 0, prompt_logprobs=3)]
    with RankPool(1, backend="auto", timeout_s=600) as pool:
        done, reports, _, replayed, backend, _ = pool.run(_serve, asks, 4, deployment, ScriptedPolicy((Layout.TP,)))[0]
    if backend == "reference":
        pytest.skip("no accelerator backend installed")
    assert replayed > 0, "no decode step replayed a graph"
    for a in asks:
        generated, token_lps, prompt_lps, reason = done[a.id]
        prompt = PROMPTS[a.id]
        assert reason == "length" and len(generated) == a.max_new_tokens
        logits = _reference_logits(prompt, generated or [0], json.dumps(deployment), "cuda")
        reference = torch.log_softmax(logits, -1)
        if a.prompt_logprobs is not None:
            _compare(prompt_lps, reference[: len(prompt) - 1], prompt[1:], a.prompt_logprobs, atol=1e-3)
        if a.logprobs is not None:
            _compare(token_lps, reference[len(prompt) - 1:], generated, a.logprobs, atol=1e-3)
        if a.max_new_tokens:
            rows = logits[len(prompt) - 1:]
            adjusted = adjust_logits(rows, [a.sampling] * len(rows), History.of(
                [prompt] * len(rows), [generated[:k] for k in range(len(rows))], rows.shape[1]))
            want = adjusted.argmax(-1) if a.sampling.greedy else choose_rows(
                adjusted, [a.sampling] * len(rows), [uniform(a.sampling, a.id, i) for i in range(len(rows))])
            assert generated == want.tolist(), a
    assert [f for r in reports for f in r["finished"]] == [(3, "length")]
