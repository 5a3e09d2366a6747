"""Requests that can never run, refused up front (issue 36 §2): one line on stderr, exit 2, no
traceback, before any rank starts or anything big is allocated — ``generate`` past the context
length or the KV pool (the rule admission and ``splash serve`` apply), ``generate --T`` below 1,
and ``decide``/``plan`` batches whose arrays would take hundreds of GiB."""

from __future__ import annotations

import tracemalloc

import pytest
from cli_lines import one_line

import splash_core.engine
from splash_core.cli.main import main
from splash_core.engine.policy import make_policy
from splash_core.engine.preflight import JobError, check_requests
from splash_core.profiles import load
from splash_core.profiles.workload import RequestSpec

DECIDE = ["decide", "--deployment", "h200-x8-deepseek-v3.2"]
PLAN = ["plan", "--from", "TP", "--to", "CP", "--model", "deepseek-v3", "--T", "8"]


@pytest.fixture
def no_group(monkeypatch):
    """Starting ranks fails the test: a refusal must come before any."""
    def started(*args, **kwargs):
        raise AssertionError("a group was started for a request that can never run")

    monkeypatch.setattr(splash_core.engine, "run_job", started)


@pytest.mark.parametrize("args, message", [
    (["--max-new-tokens", "1000000000"], "5 prompt + 1000000000 output tokens exceed this model's context length "
                                         "of 512 tokens (max_position_embeddings in its config.json)"),
    (["--max-new-tokens", "508"], "5 prompt + 508 output tokens exceed this model's context length of 512"),
    (["--T", "0"], "argument --T: must be >= 1 (got 0)"),
    (["--T", "-2"], "argument --T: must be >= 1 (got -2)"),
])
def test_generate_refuses_what_can_never_run_in_one_line_before_starting_ranks(capsys, no_group, args, message):
    assert main(["generate", "--prompt-ids", "1,2,3,4,5", *args]) == 2
    line = one_line(capsys, "generate")
    assert line.startswith("splash generate: error: ") and message in line, line


def test_under_torchrun_only_rank_0_says_why(capsys, no_group, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        assert main(["generate", "--prompt-ids", "1,2,3,4,5", "--max-new-tokens", "1000000000"]) == 2
        if rank == "1":
            assert capsys.readouterr() == ("", "")
    assert "exceed this model's context length of 512 tokens" in one_line(capsys, "generate")


def test_the_kv_rule_refuses_a_request_no_layout_holds_without_allocating_its_pool():
    """The rule ``generate`` and ``run`` apply before starting (and ``serve`` to every request):
    the pool as the budget sizes it, no layout of the policy holds 10^9 tokens; a request that
    fits passes (the check can pass as well as fail)."""
    deployment = load("deployment", "cpu-tiny")
    policy = make_policy("splash", deployment)
    tracemalloc.start()
    try:
        with pytest.raises(JobError) as caught:
            check_requests(deployment, [RequestSpec(0, 5, 10 ** 9)], 1, policy, None, "--max-new-tokens")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert message.startswith("--max-new-tokens: request 0 can never run: 5 prompt + 1000000000 output tokens need "
                              "more KV pages per layer on one rank than the pool's "), message
    assert "give the deployment more memory or shorten the requests" in message and peak < 16 << 20, peak
    assert check_requests(deployment, [RequestSpec(0, 5, 10)], 1, policy, None, "--max-new-tokens").pages >= 1
    with pytest.raises(JobError, match="^workload 'empty': no requests to run$"):
        check_requests(deployment, [], 1, policy, None, "workload 'empty'")


@pytest.mark.parametrize("argv, message", [
    (DECIDE + ["--requests", "100000000x8k"], "--requests: 100,000,000 requests in one batch exceed the 131,072"),
    (DECIDE + ["--requests", "100000x8k,100000x1k"], "--requests: 200,000 requests in one batch exceed"),
    (DECIDE + ["--requests", "4x1e30"], "bad token count '1e30': expected a whole number from 0 to 1,099,511,627,776"),
    (DECIDE + ["--requests", "4xinf"], "bad token count 'inf'"),
    (PLAN + ["--batch", "4", "--context", "1e12"], "--context: the batch holds 62,500,000,000 KV pages of 64 tokens, "
                                                   "more than the 33,554,432"),
    (PLAN + ["--batch", "1000000000", "--context", "1"], "--batch: 1,000,000,000 requests in one batch exceed"),
    (PLAN + ["--batch", "2", "--context", "5,nan"], "bad token count 'nan'"),
])
def test_decide_and_plan_refuse_batches_past_their_bounds_without_allocating(capsys, argv, message):
    tracemalloc.start()
    try:
        code = main(argv)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    line = one_line(capsys, argv[0])
    assert code == 2 and message in line and peak < 64 << 20, (line, peak)


def test_a_plan_within_the_bounds_is_still_answered(capsys):
    """The bounds refuse only past them: 32 requests of 1m tokens (2^19 pages) plan as before."""
    assert main(PLAN + ["--batch", "32", "--context", "1m", "--json"]) == 0
    assert '"fetched_bytes_group"' in capsys.readouterr().out



def test_generate_says_why_the_engine_rejected_its_request_in_one_line(capsys, monkeypatch):
    """A request the engine ended at run time (a switch it needed was refused: the controller's
    last resort) is one line naming the reason, exit 2, not "0 tokens ... FAILED"."""
    import types

    import splash_core.cli.generate as generate

    reason = "100 prompt + 10 output tokens fit the KV pool (4 pages ...) only in CP, not in TP, and the switch ..."
    summary = types.SimpleNamespace(rejected=({"id": 0, "reason": reason},))
    monkeypatch.setattr(generate, "run_group", lambda *a: summary)
    assert main(["generate", "--prompt-ids", "1,2,3", "--no-check"]) == 2
    assert one_line(capsys, "generate") == f"splash generate: error: the request was rejected: {reason}"
