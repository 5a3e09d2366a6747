"""Workload profiles and the deployment simulator (a model: every number from Eq 10 / Eq 7)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from splash_core.cli.main import main
from splash_core.layouts import LAYOUTS
from splash_core.planning.costmodel import BatchArrays, CostModel
from splash_core.profiles import ProfileError, load
from splash_core.studies.simulator import ORACLE, SPLASH, simulate

# The CPU profile as first calibrated here (2-core VM), frozen so these tests do not move
# when profiles/hardware/cpu.yaml is recalibrated.
CPU = {"memory_gib": 16, "matmul_tflops": 0.0723, "weight_read_gbps": 6.5852, "kv_read_gbps": 1.2208,
       "all_gather_gbps": 0.5487, "all_to_all_gbps": 0.8666, "all_reduce_gbps": 0.8077,
       "collective_latency_us": 493.722, "step_overhead_us": 500}


def cpu_tiny(**hardware):
    values = dict(CPU, **hardware)
    data = {"name": "cpu-frozen", "platform": "cpu", "device": "test"}
    data.update({k: {"value": v, "source": "assumed", "ref": "test copy of cpu.yaml"} for k, v in values.items()})
    # the synthetic tiny model these budgets were sized for (cpu-tiny itself serves a checkpoint)
    return dataclasses.replace(load("deployment", "cpu-tiny"), hardware=load("hardware", data),
                               model=load("model", "tiny-mla"))


def workload(**spec):
    kind = "sweep" if "input_tokens" in spec else "rollout"
    return load("workload", {"name": "test", "seed": 5, kind: spec})


def test_sweep_is_the_papers_protocol():
    w = load("workload", "sweep-b16-128k")
    reqs = w.requests()
    assert len(reqs) == 16 == w.concurrency
    assert {(r.prompt_tokens, r.max_new_tokens, r.arrival_s) for r in reqs} == {(131072, 1024, 0.0)}
    assert w.total_tokens == 16 * (131072 + 1024)


def test_rollout_is_seeded_with_a_long_tail():
    w = workload(requests=200, prompt_tokens=[10, 20], output_tokens=[5, 9], long_tail_requests=7,
                 long_tail_tokens=[100, 120])
    reqs = w.requests()
    assert reqs == w.requests()  # deterministic
    assert sum(r.max_new_tokens >= 100 for r in reqs) == 7
    assert all(10 <= r.prompt_tokens <= 20 and (5 <= r.max_new_tokens <= 9 or 100 <= r.max_new_tokens <= 120)
               for r in reqs)
    ids = w.prompt_token_ids(reqs[3], vocab_size=50)
    assert len(ids) == reqs[3].prompt_tokens and ids.max() < 50 and (ids == w.prompt_token_ids(reqs[3], 50)).all()
    tiny = load("workload", "rollout-tiny")
    assert len(tiny.requests()) == 12 and sum(r.max_new_tokens >= 48 for r in tiny.requests()) == 2


@pytest.mark.parametrize("data,where", [
    ({"sweep": {"requests": 2, "input_tokens": 8}, "rollout": {"requests": 1, "prompt_tokens": [1, 2],
                                                               "output_tokens": [1, 2]}}, "sweep"),
    ({}, "sweep"),
    ({"rollout": {"requests": 4, "prompt_tokens": [9, 2], "output_tokens": [1, 2]}}, "rollout.prompt_tokens"),
    ({"rollout": {"requests": 4, "prompt_tokens": [1, 2], "output_tokens": [1, 2], "long_tail_requests": 5,
                  "long_tail_tokens": [3, 4]}}, "rollout.long_tail_requests"),
    ({"sweep": {"requests": 0, "input_tokens": 8}}, "sweep.requests"),
    ({"sweep": {"requests": 2, "input_tokens": 8, "burst": 1}}, "sweep.burst"),
])
def test_bad_workloads_name_the_key(data, where):
    with pytest.raises(ProfileError, match=rf"^<workload>: {where}: "):
        load("workload", {"name": "bad", **data})


def test_every_policy_serves_the_rollout_and_splash_switches():
    dep, w = cpu_tiny(), load("workload", "rollout-tiny")
    sim = simulate(dep, w)
    assert [r.policy for r in sim.results] == [*map(str, LAYOUTS), SPLASH, ORACLE]
    for r in sim.results:
        assert r.tokens == w.total_tokens and not r.rejected
        assert r.throughput == pytest.approx(r.tokens / r.total_time_s)
        if r.policy not in (SPLASH, ORACLE):
            assert r.layout_steps == {r.policy: r.steps} and not r.switches
    splash, oracle = sim.result(SPLASH), sim.result(ORACLE)
    assert splash.switches and sum(splash.layout_steps.values()) == splash.steps
    assert all(0 <= s.exposed_s <= s.blocking_s + 1e-12 for s in splash.switches)
    assert splash.switch_time_s == pytest.approx(sum(s.exposed_s for s in splash.switches))
    assert sim.splash_ratio == pytest.approx(splash.throughput / sim.best_fixed.throughput)
    # the oracle runs every step in its fastest layout and switches for free: nothing beats it here
    assert sim.best_fixed.policy != ORACLE and not oracle.switches
    assert all(oracle.throughput >= r.throughput * (1 - 1e-9) for r in sim.results)
    assert "not a measurement" in sim.note


def test_memory_limits_queue_requests_and_reject_what_never_fits():
    # 8 requests of 6,000 tokens on a small budget: TP (replicated KV) serves them in waves
    dep = dataclasses.replace(cpu_tiny(memory_gib=0.03), memory_fraction=1.0)
    sim = simulate(dep, workload(requests=8, input_tokens=6000, output_tokens=16), policies=("TP", "DOP"))
    tp, dop = sim.result("TP"), sim.result("DOP")
    assert tp.tokens == dop.tokens == 8 * 6016
    most = {r.policy: max(n for _, _, n in r.trace) for r in (tp, dop)}
    assert most["DOP"] == 8 and most["TP"] < 8  # TP (replicated KV) could not hold all eight at once
    huge = simulate(dep, workload(requests=2, input_tokens=400_000, output_tokens=4), policies=("TP", SPLASH))
    assert huge.result("TP").rejected == (0, 1) and huge.result(SPLASH).rejected == (0, 1)


def test_simulate_cli(tmp_path, capsys):
    png = tmp_path / "sim.png"
    assert main(["simulate", "--deployment", "cpu-tiny", "--workload", "rollout-tiny", "--json", "--plot",
                 str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["policy"] for r in out["results"]} == {"TP", "CP", "DP", "DOP", "SPLASH", "oracle"}
    assert "not a measurement" in out["note"] and out["splash_over_best_fixed"] > 0
    assert out["oracle_over_best_fixed"] >= out["splash_over_best_fixed"] - 1e-9
    assert png.stat().st_size > 10_000
    assert main(["simulate", "--deployment", "cpu-tiny", "--workload", "rollout-tiny"]) == 0
    text = capsys.readouterr().out
    assert "not a measurement" in text and "SPLASH / best fixed layout" in text and "per-step oracle" in text
    assert "switching" in text
    assert main(["simulate", "--deployment", "cpu-tiny", "--workload", "no-such-workload"]) == 2


def _squeezed(workload):
    """cpu-tiny with room for two of ``workload``'s longest requests (their KV, the replicated
    weights and TP's activations of one request prefilling up to 32,768 rows), so Eq 6 binds
    and bigger chunks must shrink."""
    dep = dataclasses.replace(cpu_tiny(), memory_fraction=1.0)
    cost = CostModel.from_deployment(dep)
    longest = max(r.prompt_tokens + r.max_new_tokens for r in workload.requests())
    rows = min(32768, max(r.prompt_tokens for r in workload.requests()))
    scratch = float(cost.evaluate(BatchArrays.of([rows], [0], query_rows=[rows])).scratch_bytes[0].max())
    gib = (2 * longest * cost.kv_bytes_token + float(cost.weights_bytes.max()) + scratch) / 2**30
    return dataclasses.replace(dep, hardware=dataclasses.replace(
        dep.hardware, memory_gib=dataclasses.replace(dep.hardware.memory_gib, value=gib)))


@dataclasses.dataclass(frozen=True)
class _Head:
    """A workload's first ``n`` requests (a rollout's hundreds of requests would take minutes)."""

    workload: object
    n: int

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def concurrency(self) -> int:
        return min(self.workload.concurrency, self.n)

    def requests(self):
        return self.workload.requests()[:self.n]

    @property
    def total_tokens(self) -> int:
        return sum(r.prompt_tokens + r.max_new_tokens for r in self.requests())


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(__file__).parents[1] / "profiles" / "workloads").glob("*.yaml")))
def test_no_step_breaks_eq6_under_any_policy(name):
    """Hold admission holds: on a deployment where memory binds, every step of every policy
    (each fixed layout, SPLASH, the oracle) fits Eq 6 in the layout it runs in, with the rows it
    runs (every workload profile; a rollout's first 48 requests)."""
    w = _Head(load("workload", name), 48)
    dep = _squeezed(w)
    budget = dep.memory_budget_bytes - dep.common_bytes - dep.reserve_bytes
    sim = simulate(dep, w, prefill_chunk=16384, decode_stride=4096)
    for r in sim.results:
        assert 0 < r.peak_need_bytes <= budget, r.policy
        assert r.tokens + sum(s.prompt_tokens + s.max_new_tokens for s in w.requests() if s.id in r.rejected) \
            == w.total_tokens
    tp = sim.result("TP")
    assert max(n for _, _, n in tp.trace) < len(w.requests())  # TP queued: memory did bind


def test_the_b200_rollout_is_wide_then_long():
    w = load("workload", "rollout-b200")
    reqs = w.requests()
    out = sorted(r.max_new_tokens for r in reqs)
    assert len(reqs) == 512 and w.concurrency == 512
    assert out[len(out) // 2] <= 16384 and sum(o >= 65536 for o in out) == 32
