"""The scheduler's picks scored by the paper's own measurements (regret), and the mechanism
that makes DOP win the paper's sweeps: admission in waves against Table 3's pools."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from splash_core.cli.main import main
from splash_core.layouts import LAYOUTS
from splash_core.planning.costmodel import BatchArrays, CostModel
from splash_core.profiles import load
from splash_core.profiles.schema import ProfileError
from splash_core.studies.sweep import predict
from splash_core.studies.sweep_paper import PaperPosition, batch_seconds, regret, repeat_gap, repeats

TP, CP, DP, DOP = LAYOUTS


def position(tp, cp, dp, dop, batch=1, tokens=1024, sweep="s"):
    return PaperPosition(sweep, batch, tokens, {TP: tp, CP: cp, DP: dp, DOP: dop})


def test_regret_adds_up_batch_times_by_the_papers_throughputs():
    a = position(100.0, 200.0, 50.0, 190.0)  # CP best, DOP within 5%
    b = position(100.0, 100.0, 100.0, 400.0, batch=2)  # DOP best
    r = regret([(a, DOP), (b, DOP)])
    t = lambda p, l: batch_seconds(p.batch, p.input_tokens, p.tokens_per_s[l])  # noqa: E731
    assert r.picks_s == pytest.approx(t(a, DOP) + t(b, DOP))
    assert r.oracle_s == pytest.approx(t(a, CP) + t(b, DOP))
    assert r.fixed_s[DOP] == pytest.approx(r.picks_s) and r.best_fixed is DOP
    assert (r.strict, r.within_ties, r.positions) == (1, 1, 2)  # 190 is 5% under 200: no tie at 3%
    assert regret([(a, DOP)], tie_margin=0.06).within_ties == 1
    assert r.picks_over_oracle > 1 and r.picks_over_best_fixed == pytest.approx(1.0)
    assert "1/2" in r.sentence() and "fixed DOP" in r.sentence()
    # no pick (nothing fit the prediction) costs the paper's slowest layout
    none = regret([(a, None)])
    assert none.unpicked == 1 and none.picks_s == pytest.approx(t(a, DP))


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -1.0])
def test_regret_refuses_what_it_cannot_score(bad):
    with pytest.raises(ValueError, match="no positions"):
        regret([])
    with pytest.raises(ValueError, match="DOP"):
        regret([(position(1.0, 1.0, 1.0, bad), TP)])


def test_repeats_are_the_positions_measured_twice():
    a, b = position(100.0, 120.0, 90.0, 80.0, sweep="input"), position(110.0, 90.0, 90.0, 80.0, sweep="batch")
    other = position(1.0, 1.0, 1.0, 1.0, batch=4)
    assert repeats([a, other, b]) == [(a, b)]
    assert repeat_gap(a, b) == pytest.approx(30 / 90)


def test_sweep_paper_prints_regret_and_the_repeats(capsys, monkeypatch):
    h200 = [PaperPosition("Input-length sweep, B = 2", 2, 64, {l: 100.0 + i for i, l in enumerate(LAYOUTS)}),
            PaperPosition("Batch-size sweep, 64 input", 2, 64, {l: 100.0 for l in LAYOUTS})]
    monkeypatch.setattr("splash_core.cli.sweep.paper_positions", lambda *a: h200)
    assert main(["sweep", "--deployment", "cpu-tiny", "--paper", "--output", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["regret"]["positions"] == 2 and out["regret"]["best_fixed"] in map(str, LAYOUTS)
    (rep,) = out["repeats"]
    assert (rep["batch"], rep["input_tokens"], rep["paper_best"]) == (2, 64, ["DOP", "TP"])
    assert main(["sweep", "--deployment", "cpu-tiny", "--paper", "--output", "8"]) == 0
    text = capsys.readouterr().out
    assert "the oracle's time" in text and "measured twice" in text


def test_testbed_properties_are_validated_at_load():
    base = {"kind": "deployment", "name": "x", "hardware": "h200-paper", "model": "deepseek-v3.2", "T": 8,
            "common_gib": 80}
    for dis, key in [({"prefill_pool_tokens": {"DOP": -1}}, "prefill_pool_tokens"),
                     ({"prefill_pool_tokens": {"DOP": ".nan"}}, "prefill_pool_tokens"),
                     ({"admission": "sometimes"}, "admission"), ({"prefill_residency": "forever"}, "prefill_residency"),
                     ({"cp_recurrent": "anywhere"}, "cp_recurrent")]:
        with pytest.raises(ProfileError, match=key):
            load("deployment", dict(base, disaggregation=dis))
    with pytest.raises(ValueError, match="cp_recurrent"):
        CostModel.from_deployment(load("deployment", "cpu-tiny"), cp_recurrent="anywhere")


def paper_testbed(**dis):
    dep = load("deployment", "h200-x8-deepseek-v3.2")
    return dataclasses.replace(dep, disaggregation=dataclasses.replace(dep.disaggregation, **dis))


def test_waves_against_table3s_pools_are_what_makes_dop_win():
    """H200, 128 x 32K (4.3M tokens): DOP's Table 3 pool (4.73M distinct tokens) holds the batch in
    one wave, CP's (3.20M) and DP's (2.96M) need two; the paper measured DOP best there. Admitted
    continuously, or with the KV leaving at its transfer, the waves vanish and so does DOP's lead."""
    testbed = predict(paper_testbed(), 128, 32768)
    assert testbed.best is DOP
    assert testbed.of(DOP).most_resident == 128 and testbed.of(CP).most_resident < 128
    for other in (dict(admission="continuous"), dict(prefill_residency="transfer"), dict(prefill_pool_tokens={})):
        assert predict(paper_testbed(**other), 128, 32768).best is not DOP, other
    # where every layout holds the batch at once, waves change nothing: CP leads (the paper too)
    assert predict(paper_testbed(), 16, 65536).best is CP


def test_a_pool_the_profile_reports_replaces_eq6s_room():
    """TP replicates each history, so a rank holds the whole group's tokens; the others 1/T."""
    pools = {TP: 4096.0, CP: 8 * 4096.0, DP: 8 * 4096.0, DOP: 8 * 8192.0}
    squeezed = predict(paper_testbed(prefill_pool_tokens=pools), 16, 4096)
    assert [squeezed.of(l).most_resident for l in LAYOUTS] == [1, 8, 8, 16]


def test_cp_can_compute_a_chunks_recurrent_rows_where_its_positions_live():
    dep = load("deployment", "dcu-x8-glm-5.3-flash")
    owner, positions = CostModel.from_deployment(dep), CostModel.from_deployment(dep, cp_recurrent="positions")
    chunk = BatchArrays.of([8192], [0], query_rows=[8192])
    i = LAYOUTS.index(CP)
    assert positions.evaluate(chunk).total_s[i] < owner.evaluate(chunk).total_s[i]  # 8 ranks, not the owner alone
    assert positions.evaluate(chunk).comm_s[i] > owner.evaluate(chunk).comm_s[i]  # the state hand-off
    decode = BatchArrays.of([4096] * 16, list(np.arange(16) % 8))
    assert positions.evaluate(decode).total_s[i] == pytest.approx(owner.evaluate(decode).total_s[i])
    for layout in (TP, DP, DOP):
        j = LAYOUTS.index(layout)
        assert positions.evaluate(chunk).total_s[j] == owner.evaluate(chunk).total_s[j]
