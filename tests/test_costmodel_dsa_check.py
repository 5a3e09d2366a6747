"""``bench/costmodel_check.py --dsa``: the cost model held against what the runtime does for a
model that attends sparsely (tiny-mla's dims with a DSA indexer, top-k 8, two gloo ranks; also
GLM-5-shaped, a layer sharing the previous layer's top-k), step by step in every layout. It passes
on the runtime as it is, and fails where the two disagree (a cost model that forgets CP's candidate
exchange, charges eager decode steps where the runtime replays its captured ones (DSA decode is
captured: a graph per bucket for contexts within k and one beyond), charges indexer scores where
the runtime attends densely, prices dense attention, or charges shared layers an indexer), on a
non-finite count, on a layout without steps and on a step without requests."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import splash_core.planning.costmodel as costmodel
from splash_bench import dsa_check
from splash_core.planning.costmodel import CostModel
from splash_core.report.costmodel_check import _dsa as render_dsa


@pytest.fixture(scope="module")
def runs(rank_pools):
    return dsa_check.run_dsa(rank_pools(2))


def _problems(runs) -> list[str]:
    summary = dsa_check.check_dsa(runs, dsa_check.dsa_cost_model())
    assert summary["passed"] == (not summary["problems"] and summary["steps_compared"] > 0)
    return summary["problems"]


def test_the_runtime_and_the_cost_model_agree_on_sparse_attention(runs):
    summary = dsa_check.check_dsa(runs, dsa_check.dsa_cost_model())
    assert summary["passed"] and not summary["problems"], summary["problems"]
    assert summary["steps_compared"] >= 4 * 8 and summary["decode_capturable"]
    records = {layout: [r for steps in ranks for r in steps] for layout, ranks in runs.items()}
    decode = [r for r in records["CP"] if set(r["rows"]) == {1}]
    assert any(r["candidate_bytes"] > 0 for r in decode)  # contexts beyond k: exchanged and priced
    assert any(r["candidate_bytes"] == 0 and r["scored_rows"] == 0 for r in decode)  # within k: dense, unscored
    assert all(r["candidate_bytes"] == 0 for layout in ("TP", "DP", "DOP") for r in records[layout])
    assert all(r["attended_pairs"] > 0 for r in records["TP"] if r["scored_rows"])  # the sparse kernel ran
    assert all(r["graphs"] for rs in records.values() for r in rs)  # decode from the padded buffers
    assert "the cost model agrees with the runtime" in " ".join(render_dsa(summary))


def test_a_cost_model_without_the_candidate_exchange_fails(runs, monkeypatch):
    monkeypatch.setattr(CostModel, "cp_candidate_bytes", lambda self, x, loads=None: 0.0)
    summary = dsa_check.check_dsa(runs, dsa_check.dsa_cost_model())
    assert not summary["passed"] and all(p.startswith("CP ") for p in summary["problems"])
    assert "the cost model charges 0" in summary["problems"][0]
    text = "\n".join(render_dsa(summary))
    assert "disagrees with" in text and summary["problems"][0] in text


def test_a_cost_model_charging_eager_decode_fails(runs, monkeypatch):
    monkeypatch.setattr(costmodel, "decode_capturable", lambda **kw: False)
    assert "the cost model charges decode eager" in _problems(runs)[0]
    monkeypatch.undo()
    flipped = copy.deepcopy(runs)  # or a runtime that runs eagerly while the rule says it captures
    flipped["DP"][1][-1]["graphs"] = False
    assert "DP step" in _problems(flipped)[0]


def test_a_cost_model_scoring_or_attending_otherwise_fails(runs, monkeypatch):
    # scores charged even where no context exceeds k (the runtime then attends densely)
    monkeypatch.setattr(CostModel, "scored_pairs", lambda self, x, loads=None: np.ones((4, self.T)))
    assert any("the indexer scored on ranks" in p for p in _problems(runs))
    monkeypatch.undo()
    # every visible key attended, as without top-k
    dense_loads = costmodel.rank_loads
    monkeypatch.setattr(costmodel, "rank_loads", lambda x, T, P, topk=None: dense_loads(x, T, P, None))
    assert any("(row, key) pairs" in p for p in _problems(runs))


def test_the_check_fails_on_nan_empty_input_and_zero_requests(runs):
    for layout, rank, count in (("CP", 0, "candidate_bytes"), ("TP", 1, "scored_rows"), ("DOP", 0, "attended_pairs")):
        for value in (float("nan"), float("inf")):
            planted = copy.deepcopy(runs)
            planted[layout][rank][-1][count] = value
            assert any(count in p for p in _problems(planted)), (layout, count, value)
    cost = dsa_check.dsa_cost_model()
    assert not dsa_check.check_dsa({}, cost)["passed"]
    assert "DOP: no steps" in dsa_check.check_dsa({**runs, "DOP": [[], []]}, cost)["problems"][0]
    assert not dsa_check.check_dsa({**runs, "DP": runs["DP"][:1]}, cost)["passed"]
    assert not dsa_check.check_dsa({**runs, "TP": [runs["TP"][0], runs["TP"][1][:-1]]}, cost)["passed"]
    empty_step = copy.deepcopy(runs)
    empty_step["DP"][0][0].update(ids=[], owners=[], contexts=[], rows=[])
    assert "a step without requests" in " ".join(dsa_check.check_dsa(empty_step, cost)["problems"])


def test_shared_indexer_layers_agree_and_charging_them_an_indexer_fails(rank_pools, monkeypatch):
    glm = dsa_check.DSA_MODELS[1][1]
    runs = dsa_check.run_dsa(rank_pools(2), glm)
    summary = dsa_check.check_dsa(runs, dsa_check.dsa_cost_model(glm))
    assert summary["passed"], summary["problems"]
    assert "67% of layers selecting" in summary["model"]
    charged_all = costmodel.kind_costs
    monkeypatch.setattr(costmodel, "kind_costs", lambda *a: charged_all(*a[:5], 1.0))  # every layer selects
    problems = dsa_check.check_dsa(runs, dsa_check.dsa_cost_model(glm))["problems"]
    assert problems and all("candidate bytes per selecting layer" in p for p in problems)
