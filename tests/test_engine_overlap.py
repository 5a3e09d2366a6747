"""Planning step k+1 while the device runs step k (issue 22 §3): rank 0 books a greedy step in the
current layout ahead of its tokens, the next plan feeds them by reference to the device's tokens,
and the tokens are confirmed once they reach the host. Here: the controller's books (a stop id found
a step late, a request aborted while its step is in flight), the plan's references on the wire, and
the engine on gloo ranks giving the same tokens with and without overlap, with stop ids, sampled
requests and switches, and saying how it booked every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_engine_units import _Recorder

from splash_core.engine import Job, serve
from splash_core.engine.admission import KVCapacity
from splash_core.engine.controller import Controller
from splash_core.engine.draws import uniform
from splash_core.engine.plan import Command, exchange
from splash_core.engine.policy import FixedPolicy, ScriptedPolicy
from splash_core.engine.requests import GenerationRequest, Request, State
from splash_core.layouts import Layout
from splash_core.profiles.workload import RequestSpec
from splash_core.runtime.sampling import RowDraw, SamplingParams

TP, DP = Layout.TP, Layout.DP


def _controller(outputs=4, stop=()):
    reqs = [Request(RequestSpec(i, 3, outputs), np.array([1, 2, 3]) + i, sampling=SamplingParams(stop_token_ids=stop))
            for i in range(2)]
    cap = KVCapacity(pages=64, page_size=16, T=1, source="test")
    return reqs, Controller(reqs, FixedPolicy(TP), cap, concurrency=4, prefill_chunk=8, layout=TP)


def test_a_step_booked_ahead_is_fed_by_reference_and_confirmed_in_order():
    reqs, ctrl = _controller()
    first = ctrl.plan(0, T=1, page_size=16)  # both prompts whole: each yields its first token
    ctrl.book_ahead(first)
    assert all(r.state is State.DECODING and r.generated == [] and r.ahead == 1 for r in reqs)
    second = ctrl.plan(1, T=1, page_size=16)  # planned before step 0's tokens are known
    assert second.tokens.tolist() == [-1, -2]  # rows 0 and 1 of step 0's tokens, on the device
    ctrl.confirm(first, np.array([40, 41]), 0.01)
    assert [r.generated for r in reqs] == [[40], [41]] and all(r.ahead == 0 for r in reqs)
    ctrl.book_ahead(second)
    ctrl.confirm(second, np.array([50, 51]), 0.01)
    assert [r.generated for r in reqs] == [[40, 50], [41, 51]]
    assert [s.booked for s in ctrl.steps] == ["ahead", "ahead"]


def test_finishing_by_length_is_known_ahead_and_released_by_the_next_plan():
    reqs, ctrl = _controller(outputs=1)
    first = ctrl.plan(0, T=1, page_size=16)
    ctrl.book_ahead(first)
    assert all(r.state is State.FINISHED for r in reqs) and ctrl.idle
    ctrl.confirm(first, np.array([7, 8]), 0.01)
    stop = ctrl.plan(1, T=1, page_size=16)
    assert stop.command is Command.STOP and sorted(stop.releases) == [0, 1]
    assert [r.generated for r in reqs] == [[7], [8]] and [r.finish_reason for r in reqs] == ["length"] * 2


def test_a_stop_id_found_a_step_late_finishes_the_request_where_it_was_emitted():
    reqs, ctrl = _controller(outputs=5, stop=(99,))
    first = ctrl.plan(0, T=1, page_size=16)
    ctrl.book_ahead(first)
    second = ctrl.plan(1, T=1, page_size=16)  # request 0 gets a row: nobody knows it stopped
    assert [q.id for q in second.requests] == [0, 1]
    ctrl.confirm(first, np.array([99, 5]), 0.01)  # request 0 emitted its stop id in step 0
    assert reqs[0].state is State.FINISHED and reqs[0].finished_step == 0 and reqs[0].generated == [99]
    ctrl.book_ahead(second)
    ctrl.confirm(second, np.array([12, 6]), 0.01)  # request 0's row of step 1 is dropped
    assert reqs[0].generated == [99] and reqs[0].finish_reason == "stop" and reqs[1].generated == [5, 6]
    third = ctrl.plan(2, T=1, page_size=16)
    assert third.releases == (0,) and [q.id for q in third.requests] == [1]


def test_a_request_aborted_while_its_step_runs_drops_its_token():
    reqs, ctrl = _controller()
    first = ctrl.plan(0, T=1, page_size=16)
    ctrl.book_ahead(first)
    ctrl.abort([1], step=1)
    ctrl.forget([1])  # a server forgets it at once
    second = ctrl.plan(1, T=1, page_size=16)
    assert [q.id for q in second.requests] == [0] and second.releases == (1,)
    produced = ctrl.confirm(first, np.array([3, 4]), 0.01)
    assert [r.id for r in produced] == [0] and reqs[1].generated == [] and reqs[1].state is State.ABORTED


def test_a_switching_step_is_never_booked_ahead():
    reqs, ctrl = _controller()
    plan = ctrl.plan(0, T=1, page_size=16)
    ctrl.layout = DP  # as if the plan switched
    with pytest.raises(RuntimeError, match="switching step"):
        ctrl.book_ahead(plan)


def test_references_on_the_wire_take_the_previous_steps_device_tokens():
    reqs, ctrl = _controller()
    first = ctrl.plan(0, T=1, page_size=16)
    ctrl.book_ahead(first)
    second = ctrl.plan(1, T=1, page_size=16)
    previous = torch.tensor([70, 71])
    sender = _Recorder()
    _, tokens0 = exchange(sender, "cpu", second, previous)
    plan1, tokens1 = exchange(_Recorder(sender.sent), "cpu", None, previous)
    assert tokens0.tolist() == tokens1.tolist() == [70, 71] and plan1.tokens.tolist() == [-1, -2]
    with pytest.raises(RuntimeError, match="does not hold"):
        exchange(_Recorder(), "cpu", second, None)


def test_sampled_outputs_travel_as_draws_of_the_index_they_will_have():
    warm = SamplingParams(temperature=0.8, top_k=7, top_p=0.9, seed=5)
    reqs = [Request(RequestSpec(0, 3, 4), np.array([1, 2, 3]), sampling=warm),
            Request(RequestSpec(1, 3, 4), np.array([4, 5, 6]))]
    cap = KVCapacity(pages=64, page_size=16, T=1, source="test")
    ctrl = Controller(reqs, FixedPolicy(TP), cap, concurrency=4, prefill_chunk=8, layout=TP)
    first = ctrl.plan(0, T=1, page_size=16)
    row = [q.id for q in first.requests].index(0)
    assert first.draws == (RowDraw(row, warm, uniform(warm, 0, 0)),)  # only the sampled request draws
    ctrl.book_ahead(first)
    second = ctrl.plan(1, T=1, page_size=16)  # output 1 of request 0, while output 0 is still in flight
    assert second.draws == (RowDraw([q.id for q in second.requests].index(0), warm, uniform(warm, 0, 1)),)
    sender = _Recorder()
    exchange(sender, "cpu", second, torch.tensor([70, 71]))
    got, _ = exchange(_Recorder(sender.sent), "cpu", None, torch.tensor([70, 71]))
    (d,) = got.draws  # the other ranks get row, temperature, top-k, top-p and u bit for bit
    assert (d.row, d.u, d.params.temperature, d.params.top_k, d.params.top_p) == (
        second.draws[0].row, uniform(warm, 0, 1), 0.8, 7, 0.9)
    assert got.releases == second.releases and got.tokens.tolist() == second.tokens.tolist()


# ---- the engine on gloo ranks ---------------------------------------------------------

PROMPTS = ((5, 9, 14, 3, 8), (7, 7, 21), (30, 2, 11, 19, 4, 6, 1), (12,))


def _generate(ctx, jobs):
    return [serve(ctx, job) for job in jobs]


def _jobs(sampling, policy, overlap_both=True):
    prompts = tuple(GenerationRequest(p, 9 if s.greedy else 3, s) for p, s in zip(PROMPTS, sampling))
    return [Job("cpu-tiny", policy=policy, prompts=prompts, overlap=o) for o in ((True, False) if overlap_both else (True,))]


def test_overlap_gives_the_same_tokens_as_waiting_for_every_step(rank_pools):
    """Greedy requests with stop ids taken from their own first run (so some stop a step before
    the engine learns it), one short sampled request (chosen on every rank's device from the
    plan's draws, so its steps are booked ahead too), and forced switches every 3 steps."""
    pool = rank_pools(2)
    plain = [SamplingParams()] * len(PROMPTS)
    first = pool.run(_generate, _jobs(plain, "TP", overlap_both=False))[0][0]
    stops = [SamplingParams(stop_token_ids=(out["token_ids"][3],)) for out in first.outputs[:2]]
    sampling = stops + [SamplingParams(temperature=0.9, top_k=20, seed=3), SamplingParams()]
    policy = ScriptedPolicy((TP, DP, Layout.DOP, Layout.CP), every=3)
    ahead, waited = pool.run(_generate, _jobs(sampling, policy))[0]
    for a, w in zip(ahead.outputs, waited.outputs):
        assert a["token_ids"] == w["token_ids"] and a["finish_reason"] == w["finish_reason"]
    assert [o["finish_reason"] for o in ahead.outputs][:2] == ["stop", "stop"]
    assert all(len(o["token_ids"]) <= 4 for o in ahead.outputs[:2])
    assert ahead.check["passed"] and waited.check["passed"]
    assert ahead.booked.get("ahead", 0) > 0 and ahead.booked.get("switch", 0) > 0
    assert set(ahead.booked) <= {"ahead", "switch"}  # sampled outputs no longer make the host wait
    assert "ahead" not in waited.booked and waited.booked.get("sync", 0) > 0
    assert sum(waited.booked.values()) == waited.steps
    assert sum(ahead.booked.values()) == ahead.steps
    for run in (ahead, waited):  # every step, however booked, has its device time (here the host's)
        assert len(run.step_device_ms) == run.steps and all(0 < ms < 60e3 for ms in run.step_device_ms)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_overlap_gives_the_tokens_of_waiting_and_replays_its_decode_steps():
    """A tiny model on one GPU (the accelerator backend, decode graphs captured at start-up):
    greedy requests with a stop id and a sampled one, served with and without overlap, equal
    each other and the single-device reference."""
    import yaml

    from splash_core.profiles.loader import builtin_root
    from splash_core.runtime.spawn import RankPool

    deployment = yaml.safe_load((builtin_root() / "deployments" / "cpu-tiny.yaml").read_text())
    # tiny-mla (a dense MLP): the tiny checkpoint's fp32 experts fall back to a matmul that reads
    # counts on the host, which no graph can capture (tests/test_cuda_graphs.py covers that path)
    deployment.update(name="gpu-tiny-overlap", backend="auto", hardware="h200", T=1, memory_fraction=0.2,
                      model="tiny-mla")
    with RankPool(1, backend="auto", timeout_s=600) as pool:
        plain = [SamplingParams()] * len(PROMPTS)
        first = pool.run(_generate, [Job(deployment, policy="TP", prompts=tuple(
            GenerationRequest(p, 9, s) for p, s in zip(PROMPTS, plain)))])[0][0]
        if first.backend == "reference":
            pytest.skip("no accelerator backend installed")
        stop = SamplingParams(stop_token_ids=(first.outputs[0]["token_ids"][3],))
        warm = SamplingParams(temperature=0.9, top_p=0.95, seed=4)  # chosen on the GPU from the plan's draws
        prompts = tuple(GenerationRequest(p, 9, (stop, warm)[i] if i < 2 else SamplingParams())
                        for i, p in enumerate(PROMPTS))
        ahead, waited = pool.run(_generate, [Job(deployment, policy="TP", prompts=prompts, overlap=o)
                                             for o in (True, False)])[0]
    assert [o["token_ids"] for o in ahead.outputs] == [o["token_ids"] for o in waited.outputs]
    assert ahead.outputs[0]["finish_reason"] == "stop" and ahead.check["passed"] and waited.check["passed"]
    assert set(ahead.booked) == {"ahead"} and ahead.outputs[1]["token_ids"] != first.outputs[1]["token_ids"]
    assert ahead.booked.get("ahead", 0) > 0 and "ahead" not in waited.booked
    assert ahead.load.get("graphs"), "the start-up captured no decode graphs"
    assert len(ahead.step_device_ms) == ahead.steps and all(0 < ms < 60e3 for ms in ahead.step_device_ms)
