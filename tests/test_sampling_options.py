"""The sampling options evaluation tools need (issue 36 §3), as pure functions: min_tokens, min_p,
the repetition / presence / frequency penalties (:func:`adjust_logits`), the device history they
read, the plan's sampling section, and scoring-only requests (max_new_tokens 0)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from splash_core.engine import logprobs
from splash_core.engine.admission import KVCapacity
from splash_core.engine.controller import Controller
from splash_core.engine.draws import StepSampling, uniform
from splash_core.engine.plan import Command, StepPlan, exchange
from splash_core.engine.policy import FixedPolicy
from splash_core.engine.requests import Request, State
from splash_core.layouts import Layout
from splash_core.profiles.workload import RequestSpec
from splash_core.runtime.sampling import (History, RowDraw, SamplingParams, adjust_logits, apply_draws, choose,
                                          choose_rows, in_kept, kept)
from splash_core.runtime.step_batch import StepRequest
from splash_core.runtime.token_history import TokenHistory

LOGITS = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]])


def _history(prompt=(), outputs=()):
    return History.of([prompt], [outputs], LOGITS.shape[1])


@pytest.mark.parametrize("field, value", [("min_p", -0.1), ("min_p", 1.5), ("min_tokens", -1),
                                          ("repetition_penalty", 0.0), ("repetition_penalty", float("nan")),
                                          ("presence_penalty", 2.5), ("frequency_penalty", -3.0),
                                          ("frequency_penalty", float("nan")), ("temperature", float("nan"))])
def test_bad_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_defaults_adjust_nothing_and_keep_todays_choices_bit_for_bit():
    plain = SamplingParams(temperature=0.7, top_k=3, seed=4)
    assert not SamplingParams().adjusts and not plain.adjusts
    assert adjust_logits(LOGITS, [plain], None) is LOGITS  # not even a copy
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g)
    draws = [RowDraw(r, SamplingParams(temperature=0.5 + r / 4, top_p=0.9 if r % 2 else 1.0), 0.1 * r + 0.05)
             for r in (1, 2, 4)]
    rows = torch.tensor([1, 2, 4])
    today = logits.argmax(-1).index_copy(0, rows, choose_rows(logits[rows], [d.params for d in draws],
                                                              [d.u for d in draws]))
    assert torch.equal(apply_draws(logits.argmax(-1), logits, draws), today)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    out = adjust_logits(LOGITS, [SamplingParams(repetition_penalty=2.0)], _history(prompt=(0, 1), outputs=(3,)))
    assert out.tolist() == [[1.0, -2.0, 0.5, 1.5, -2.0, 1.0]]  # tokens 0, 1 (prompt) and 3 (output) only


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = adjust_logits(LOGITS, [p], _history(prompt=(2,), outputs=(3, 3, 5)))
    assert out.tolist() == [[2.0, -1.0, 0.5, 3.0 - 0.5 - 0.5, -2.0, 1.0 - 0.5 - 0.25]]
    negative = adjust_logits(LOGITS, [SamplingParams(presence_penalty=-2.0)], _history(outputs=(1,)))
    assert negative[0, 1] == 1.0  # a negative penalty favours what was said


def test_min_tokens_masks_stop_ids_until_enough_tokens_were_generated():
    p = SamplingParams(min_tokens=2, stop_token_ids=(3, 99))  # 99: outside the vocabulary, ignored
    early = adjust_logits(LOGITS.repeat(2, 1), [p, p], History.of([(), ()], [(1,), (1, 2)], 6))
    assert early[0, 3] == float("-inf") and early[1, 3] == 3.0  # 1 generated: masked; 2: free
    assert int(early[0].argmax()) == 0 and choose(early[0], SamplingParams(), 0.5) == 0
    with pytest.raises(ValueError, match="History"):
        adjust_logits(LOGITS, [p], None)


def test_min_p_keeps_tokens_within_its_share_of_the_most_likely():
    probs = torch.softmax(LOGITS[0].double(), 0)
    for top_k in (0, 4):  # vocabulary order (probabilities zeroed) and the sorted path
        p = SamplingParams(temperature=1.0, min_p=0.3, top_k=top_k)
        expect = sorted(int(i) for i in torch.nonzero(probs >= 0.3 * probs.max())[:, 0])
        chosen = {choose(LOGITS[0], p, u) for u in np.linspace(0, 0.999, 200)}
        assert chosen == set(expect) == {0, 3}
        assert in_kept(LOGITS.repeat(6, 1), [p] * 6, torch.arange(6)).tolist() == [i in expect for i in range(6)]
        greedy = SamplingParams(temperature=1.0, min_p=1.0, top_k=top_k)
        assert all(choose(LOGITS[0], greedy, u) == 3 for u in (0.0, 0.5, 0.999))
        assert kept(LOGITS[0], greedy)[0].count_nonzero() == 1


def test_an_adjusted_greedy_row_takes_the_argmax_of_its_adjusted_logits():
    greedy = RowDraw(0, SamplingParams(repetition_penalty=10.0), 0.0, request=7)
    sampled = RowDraw(1, SamplingParams(temperature=1.0, frequency_penalty=2.0), 0.3, request=8)
    logits = LOGITS.repeat(2, 1)
    history = History.of([(3,), ()], [(), (3, 3)], 6)
    out = apply_draws(logits.argmax(-1), logits, [greedy, sampled], history)
    assert out[0] == 0  # 3 was in the prompt: 3 / 10 < 2
    assert out[1] == choose_rows(adjust_logits(logits[1:], [sampled.params], History.of([()], [(3, 3)], 6)),
                                 [sampled.params], [0.3])[0]


def test_the_device_history_equals_the_lists_it_was_fed():
    hist = TokenHistory(vocab=10, device="cpu")
    prompt_a, prompt_b = [1, 2, 2, 5], [7, 7]
    # step 0: a's first prompt chunk beside b's whole prompt; step 1: a's rest; steps 2-3: outputs fed back
    hist.feed([StepRequest(0, 0, 0, 3), StepRequest(1, 1, 0, 2)], torch.tensor(prompt_a[:3] + prompt_b),
              {0: 4, 1: 2})
    hist.feed([StepRequest(0, 0, 3, 1), StepRequest(1, 1, 2, 1)], torch.tensor([5, 4]), {0: 4, 1: 2})
    hist.feed([StepRequest(0, 0, 4, 1), StepRequest(1, 1, 3, 1)], torch.tensor([9, 4]), {0: 4})  # b untracked now
    got = hist.rows([1, -1, 0])
    want = History.of([prompt_b, (), prompt_a], [[4], [], [9]], 10)
    assert torch.equal(got.counts, want.counts) and torch.equal(got.prompt, want.prompt)
    hist.release(0)
    assert not hist.rows([0]).prompt.any() and hist.slots == {1: hist.slots[1]}
    for rid in range(2, 9):  # grows past its slots, reusing the freed one
        hist.feed([StepRequest(rid, 0, 0, 1)], torch.tensor([rid]), {rid: 1})
    assert hist.rows([8]).prompt[0].nonzero().tolist() == [[8]] and hist.rows([1]).counts[0, 4] == 1


class _Wire:
    """Collectives that hand rank 0's broadcasts to a receiving side."""

    def __init__(self, sent=None):
        self.sent, self.replay = ([] if sent is None else sent), sent is not None

    def broadcast(self, tensor, src):
        if self.replay:
            tensor.copy_(self.sent.pop(0))
        else:
            self.sent.append(tensor.clone())


def test_the_sampling_section_reaches_every_rank_bit_for_bit():
    p = SamplingParams(temperature=0.3, top_k=5, top_p=0.8, min_p=0.1, min_tokens=4, stop_token_ids=(2, 11),
                       repetition_penalty=1.1, presence_penalty=-0.5, frequency_penalty=1 / 3)
    section = StepSampling((RowDraw(1, p, 0.123456789, 9), RowDraw(0, SamplingParams(temperature=1.0), 0.5)),
                           ((9, 17), (4, 3)), (4,))
    assert StepSampling.decode(StepSampling().encode()) == StepSampling() and not StepSampling().encode().size
    got = StepSampling.decode(section.encode())
    assert got.tracked == section.tracked and got.scored == section.scored
    first = got.draws[0]
    assert (first.row, first.u, first.request) == (1, 0.123456789, 9)
    for name in ("temperature", "top_k", "top_p", "min_p", "min_tokens", "stop_token_ids", "repetition_penalty",
                 "presence_penalty", "frequency_penalty"):
        assert getattr(first.params, name) == getattr(p, name), name
    assert got.draws[1].params.stop_token_ids == () and got.draws[1].request == -1
    plan = StepPlan(Command.STEP, 3, Layout.TP, (StepRequest(4, 0, 0, 2), StepRequest(9, 0, 5, 1)),
                    np.array([1, 2, 3]), draws=section.draws, tracked=section.tracked, scored=section.scored)
    wire = _Wire()
    exchange(wire, "cpu", plan)
    received, _ = exchange(_Wire(wire.sent), "cpu", None)
    assert (received.draws, received.tracked, received.scored) == (got.draws, got.tracked, got.scored)


def _controller(*requests):
    cap = KVCapacity(pages=64, page_size=16, T=1, source="test")
    return Controller(list(requests), FixedPolicy(Layout.TP), cap, concurrency=4, prefill_chunk=8, layout=Layout.TP)


def test_plans_carry_draws_history_and_scored_rows_only_for_requests_that_ask():
    plain = Request(RequestSpec(0, 3, 4), np.array([1, 2, 3]))
    first = _controller(plain).plan(0, T=1, page_size=16)
    assert (first.draws, first.tracked, first.scored) == ((), (), ())  # today's plan, unchanged
    pen = SamplingParams(repetition_penalty=1.5, min_tokens=2, stop_token_ids=(6,))
    asks = Request(RequestSpec(1, 12, 3), np.arange(12), sampling=pen, prompt_logprobs=2)
    ctrl = _controller(asks)
    step0 = ctrl.plan(0, T=1, page_size=16)  # 8 of 12 prompt rows: no output yet
    assert step0.draws == () and step0.tracked == ((1, 12),) and step0.scored == (1,)
    ctrl.book_ahead(step0)
    step1 = ctrl.plan(1, T=1, page_size=16)  # the last 4 rows: output 0, stop ids still masked
    assert step1.scored == (1,) and step1.draws == (RowDraw(0, pen, uniform(pen, 1, 0), 1),)
    ctrl.book_ahead(step1)
    ctrl.book_ahead(ctrl.plan(2, T=1, page_size=16))
    step3 = ctrl.plan(3, T=1, page_size=16)  # output 2: min_tokens reached (outputs booked ahead count)
    assert step3.scored == () and step3.draws[0].params.min_tokens == 0


def test_a_request_of_no_new_tokens_scores_its_prompt_and_finishes_by_length():
    r = Request(RequestSpec(0, 5, 0), np.arange(5), prompt_logprobs=0)
    r.admit(0, 0)
    assert not r.outputs_this_step(3)
    r.advance(3, 9, 0)
    assert r.state is State.PREFILLING
    r.advance(2, 9, 1)
    assert (r.state, r.finish_reason, r.generated, r.finished_step) == (State.FINISHED, "length", [], 1)
    ahead = Request(RequestSpec(1, 2, 0), np.arange(2))
    ahead.admit(0, 0)
    assert ahead.advance_ahead(2, 0, 0) is False and ahead.state is State.FINISHED and ahead.ahead == 0


def test_rank_0s_logprobs_equal_the_log_softmax_of_their_rows(monkeypatch):
    """A prompt of 6 in one chunk (its rows 0-4 scored after the step's last rows) and its first
    output, computed in blocks of 2 rows: each entry is the log-softmax of its row at its target."""
    monkeypatch.setattr(logprobs, "_BLOCK_ROWS", 2)
    prompt = np.array([4, 1, 3, 3, 0, 2])
    r = Request(RequestSpec(5, 6, 2), prompt, logprobs=2, prompt_logprobs=1)
    plan = StepPlan(Command.STEP, 0, Layout.TP, (StepRequest(5, 0, 0, 6),), prompt, scored=(5,))
    assert logprobs.scored_rows(plan).tolist() == [0, 1, 2, 3, 4]
    logits = torch.randn(6, 9, generator=torch.Generator().manual_seed(2))  # the last row, then rows 0-4
    jobs = logprobs.LogprobJobs.of(plan, {5: r})
    jobs.book(jobs.compute(torch.tensor([7]), logits).numpy(), [r], {5: r})
    want = torch.log_softmax(logits, -1)
    assert [e.token for e in r.prompt_scores] == prompt[1:].tolist()
    assert np.allclose([e.logprob for e in r.prompt_scores], [float(want[1 + j, prompt[j + 1]]) for j in range(5)])
    assert [e.top[0][0] for e in r.prompt_scores] == want[1:].argmax(-1).tolist()
    (out,) = r.token_logprobs
    assert out.token == 7 and np.isclose(out.logprob, float(want[0, 7])) and len(out.top) == 2
    assert [t for t, _ in out.top] == want[0].topk(2).indices.tolist()
    silent = Request(RequestSpec(5, 6, 2), prompt)  # asked nothing: nothing computed
    assert logprobs.LogprobJobs.of(dataclasses.replace(plan, scored=()), {5: silent}) is None


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_k=5),
                                    SamplingParams(temperature=1.0, top_p=0.9),
                                    SamplingParams(temperature=0.7, min_p=0.1), SamplingParams(temperature=0.7)])
def test_non_finite_logits_still_choose_a_token_of_the_vocabulary(params):
    """A NaN checkpoint must not crash the step (an index past the vocabulary is a device fault);
    the reference check is what reports it."""
    logits = torch.full((2, 50), float("nan"))
    logits[1, 3] = float("inf")
    chosen = choose_rows(logits, [params, params], [0.3, 0.9])
    assert ((chosen >= 0) & (chosen < 50)).all()
