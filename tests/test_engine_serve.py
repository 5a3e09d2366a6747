"""The engine end to end on T = 2 gloo ranks: forced switches through all 12 directions, admission
and rejection, and faults (a rank that exits or hangs mid-run stops the group with an error
naming it, within the collective timeout). The scheduler-driven run is the CLI's default job
(tests/test_engine_cli.py)."""

from __future__ import annotations

import functools
import os
import time

import pytest
import yaml

from splash_core.engine import Job, serve
from splash_core.engine.policy import ScriptedPolicy
from splash_core.layouts import Layout
from splash_core.profiles import load
from splash_core.profiles.loader import builtin_root
from splash_core.runtime.spawn import RankError, RankPool

TP, CP, DP, DOP = Layout.TP, Layout.CP, Layout.DP, Layout.DOP
# Every ordered pair of layouts once: 13 layouts in a row, 12 switches.
ALL_DIRECTIONS = (TP, DP, TP, CP, TP, DOP, DP, CP, DP, DOP, CP, DOP, TP)


def _fault(ctx, step, *, rank, at, how):
    """on_step hook: rank ``rank`` exits or hangs when it reaches step ``at``."""
    if ctx.rank == rank and step == at:
        if how == "exit":
            os._exit(3)
        time.sleep(3600)


def test_forced_switches_through_every_direction_lose_no_request(rank_pools):
    # 32-row prefill chunks: prompts of up to 200 tokens take several steps, so switches also
    # move histories that are still mid-prompt
    job = Job("cpu-tiny", "rollout-tiny", policy=ScriptedPolicy(ALL_DIRECTIONS, every=2), prefill_chunk=32)
    summary = rank_pools(2).run(serve, job)[0]
    done = [s for s in summary.switches if not s.refused]
    assert not [s for s in summary.switches if s.refused]
    assert {(s.src, s.dst) for s in done} == {(str(a), str(b)) for a, b in zip(ALL_DIRECTIONS, ALL_DIRECTIONS[1:])}
    assert len({(s.src, s.dst) for s in done}) == 12
    specs = load("workload", "rollout-tiny").requests()
    assert summary.served == len(specs) and summary.output_tokens == sum(s.max_new_tokens for s in specs)
    assert summary.check["passed"] and summary.check["tokens"] == summary.output_tokens  # every token as the reference's
    moved = [s for s in done if s.bytes_total > 0]
    assert moved and all(s.mode == "splash" for s in done)


def test_an_fp8_kv_cache_matches_the_reference_in_every_direction(rank_pools):
    """Uniform fp8 KV (e4m3, no scales): the pool rounds every latent and rotary key; the reference
    rounds its history the same way, so every layout and every switch passes the check, with a
    tolerance of fp8's unit roundoff (1/16) and no more."""
    model = yaml.safe_load((builtin_root() / "models" / "tiny-mla.yaml").read_text())
    model.pop("kind")
    model["kv_cache"] = {"latent_dtype": "fp8", "rope_dtype": "fp8"}
    deployment = {**yaml.safe_load((builtin_root() / "deployments" / "cpu-tiny.yaml").read_text()), "model": model}
    job = Job(deployment, "rollout-tiny", policy=ScriptedPolicy(ALL_DIRECTIONS, every=4))
    summary = rank_pools(2).run(serve, job)[0]
    assert len({(s.src, s.dst) for s in summary.switches if not s.refused}) == 12
    check = summary.check
    assert check["passed"] and not check["exact"] and check["tolerance"] == 1 / 16
    assert check["tokens"] == summary.output_tokens and check["decisive"] == 0


def test_decode_graphs_are_captured_at_start_up_and_serving_captures_only_after_switches(rank_pools):
    """Static decode buffers (what graphs replay; eagerly on CPU): every bucket up to the run's
    concurrency is captured before the first step, with tables as wide as the longest request can
    grow, so a fixed-layout run captures nothing more; switches capture the destination's."""
    deployment = {**yaml.safe_load((builtin_root() / "deployments" / "cpu-tiny.yaml").read_text()),
                  "graphs": {"mode": "static"}}
    fixed, switching = rank_pools(2).run(_two_runs, deployment)[0]
    concurrency = load("workload", "rollout-tiny").concurrency
    started = fixed.load["graphs"]
    buckets = [c["bucket"] for c in started["start_up"]]
    assert buckets == [b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b < concurrency] + [buckets[-1]]
    assert buckets[-1] >= concurrency and started["while_serving"]["captures"] == 0
    assert fixed.check["passed"] and switching.check["passed"]
    assert switching.load["graphs"]["while_serving"]["captures"] > 0  # the destination layouts' graphs


def _two_runs(ctx, deployment):
    return (serve(ctx, Job(deployment, "rollout-tiny", policy="TP")),
            serve(ctx, Job(deployment, "rollout-tiny", policy=ScriptedPolicy((TP, DP, CP), every=4))))


def test_a_request_no_layout_can_hold_is_rejected_and_the_others_finish(rank_pools, tmp_path):
    workload = tmp_path / "one-too-long.yaml"
    workload.write_text("kind: workload\nseed: 3\nrollout: {requests: 6, prompt_tokens: [10, 30], "
                        "output_tokens: [2, 5], long_tail_requests: 1, long_tail_tokens: [400, 400]}\n")
    # 8 pages of 16 tokens per layer and rank: the long request needs 26-28 pages, 13-14 on a rank in CP
    summary = rank_pools(2).run(serve, Job("cpu-tiny", str(workload), policy="splash", kv_pages=8))[0]
    assert summary.requests == 6 and summary.served == 5 and len(summary.rejected) == 1
    reason = summary.rejected[0]["reason"]
    assert "in CP" in reason and "than the pool's 8" in reason
    assert summary.check["passed"] and summary.check["requests"] == 5


def test_a_bf16_run_is_checked_within_the_tolerance(rank_pools):
    """The accelerator path's check: bf16 compute against the float32 reference on the same
    rounded weights, near-ties allowed."""
    deployment = {"kind": "deployment", "name": "cpu-tiny-bf16", "backend": "reference", "hardware": "cpu",
                  "model": "tiny-mla", "T": 2, "memory_fraction": 0.5, "page_size": 16, "compute_dtype": "bf16"}
    summary = rank_pools(2).run(serve, Job(deployment, "rollout-tiny", policy="DOP"))[0]
    check = summary.check
    assert summary.compute_dtype == "bf16" and summary.served == 12
    assert check["passed"] and not check["exact"] and check["error_multiple"] == 4 and check["compute_error"] > 0
    assert check["tokens"] == summary.output_tokens


def test_a_rank_that_exits_mid_run_is_named(rank_pools):
    pool = rank_pools(2)  # this kills the shared pool; the fixture starts a new one for later tests
    hook = functools.partial(_fault, rank=1, at=5, how="exit")
    with pytest.raises(RankError) as err:
        pool.run(serve, Job("cpu-tiny", "rollout-tiny", policy="TP", check=False), on_step=hook, timeout_s=120)
    # named whether the pool first sees rank 1's death or rank 0's failed collective
    assert err.value.rank == 1 and "died during serve" in str(err.value)


def test_a_rank_that_hangs_stops_the_group_at_the_collective_timeout():
    hook = functools.partial(_fault, rank=1, at=3, how="hang")
    with RankPool(2, backend="reference", timeout_s=15) as pool:
        with pytest.raises(RankError) as err:
            pool.run(serve, Job("cpu-tiny", "rollout-tiny", policy="DP", check=False), on_step=hook, timeout_s=120)
    message = str(err.value)
    assert "did not finish within" not in message  # the collective timed out, not the test's guard
    assert err.value.rank == 0 and "[splash engine] rank 0 of 2, step 3; collectives time out after 15 s" in message
    assert "a peer (rank 1) that crashed or hung" in message
