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
