"""``splash serve --switch-mode precopy``: requests arriving and finishing while the layout keeps
changing by pre-copies (2 steps each, then the handoff) get the reference's tokens."""

from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import pytest
from served import Served

from splash_core.engine import reference_check
from splash_core.profiles import load

# a new layout every 4 steps, reached by a pre-copy of 2 steps: DP -> TP and CP -> DP move KV
ARGS = ("--policy", "script:DP,TP,CP,DP:4", "--switch-mode", "precopy", "--precopy-steps", "2", "--kv-pages", "64",
        "--context-length", "4096", "--max-running", "16")


@pytest.fixture(scope="module")
def server():
    s = Served(*ARGS)
    yield s
    s.kill()


def test_precopy_switches_while_requests_come_and_go(server):
    before = server.metrics()
    rng = np.random.default_rng(9)
    prompts = {i: rng.integers(4, 380, size=int(n)).tolist() for i, n in enumerate(rng.integers(20, 150, size=6))}
    lengths = {i: int(n) for i, n in zip(prompts, rng.integers(10, 30, size=6))}

    def one(i):
        time.sleep(0.2 * i)
        body = {"input_ids": prompts[i], "sampling_params": {"max_new_tokens": lengths[i], "temperature": 0,
                                                             "ignore_eos": True}}
        return server.post("/generate", body).json()

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        outputs = dict(zip(prompts, pool.map(one, prompts)))
    for i, out in outputs.items():
        assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) == lengths[i], out
    result = reference_check.check(load("deployment", "cpu-tiny"), {i: np.asarray(p) for i, p in prompts.items()},
                                   {i: o["output_ids"] for i, o in outputs.items()})
    assert result.passed and result.exact and result.tokens == sum(lengths.values()), result.line()
    after = server.metrics()
    switched = sum(v - before.get(k, 0.0) for k, v in after.items() if k[0] == "splash_switches_total")
    assert switched >= 3
    # every switch handed off a pre-copy, and /metrics counts them as such
    grew = {k: v - before.get(k, 0.0) for k, v in after.items()}
    by_kind = _sum(grew, "splash_switches_total", "kind")
    assert by_kind.get("precopy", 0) == switched and by_kind.get("one_step", 0) == 0, by_kind
    events = _sum(grew, "splash_precopies_total", "event")
    assert events["handed_off"] == switched and events["begun"] >= switched, events
    # DP -> TP gathers every history: its pre-copies received bytes in the background
    moved = _sum(grew, "splash_precopied_bytes_total", "dst")
    assert moved["TP"] > 0, moved


def _sum(samples: dict, name: str, label: str) -> dict:
    """{value of ``label``: the samples of ``name`` with it, summed}."""
    out: dict = {}
    for (n, labels), v in samples.items():
        if n == name:
            key = dict(labels)[label]
            out[key] = out.get(key, 0.0) + v
    return out


def test_metrics_count_precopies_and_switch_kinds():
    """A StepReport whose switch handed off a pre-copy begun 2 steps before, and another pre-copy
    begun and cancelled in it."""
    from prometheus_client.parser import text_string_to_metric_families

    from splash_core.engine.messages import StepReport
    from splash_core.server.metrics import Metrics

    handed = {"begun": 5, "ended": 7, "src": "DP", "dst": "TP", "outcome": "handed_off", "bytes": 3 << 20}
    cancelled = {"begun": 7, "ended": 7, "src": "TP", "dst": "CP", "outcome": "cancelled", "bytes": 1 << 20}
    switch = {"src": "DP", "dst": "TP", "reason": "", "refused": "", "exposed_ms": 2.0, "kind": "precopy",
              "precopy": handed}
    m = Metrics("tiny")
    m.on_step(StepReport(7, "TP", 0.01, "switch", 4, switches=(switch,), precopies=(handed, cancelled)))
    samples = [s for f in text_string_to_metric_families(m.render().decode()) for s in f.samples]
    assert samples and all(s.labels.get("model_name") == "tiny" for s in samples)
    got = {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
           for s in samples}
    assert got[("splash_switches_total", (("dst", "TP"), ("kind", "precopy"), ("src", "DP")))] == 1
    events = {k[1]: v for k, v in got.items() if k[0] == "splash_precopies_total"}
    assert events == {(("dst", "TP"), ("event", "handed_off"), ("src", "DP")): 1,
                      (("dst", "CP"), ("event", "begun"), ("src", "TP")): 1,
                      (("dst", "CP"), ("event", "cancelled"), ("src", "TP")): 1}
    assert got[("splash_precopied_bytes_total", (("dst", "TP"), ("src", "DP")))] == 3 << 20
    assert got[("splash_precopied_bytes_total", (("dst", "CP"), ("src", "TP")))] == 1 << 20
