"""The shipped scenario files reproduce the paper's Figures 1, 6 and 7 (crossovers and KV
limits), and bad scenario files fail with ``file: key.path: reason (got X)``."""

from __future__ import annotations

import functools
import json

import pytest
import yaml

from splash_core.cli.main import main
from splash_core.layouts import Layout
from splash_core.profiles import ProfileError, find, load
from splash_core.studies.capacity import scenario_limits
from splash_core.studies.timing_law import compile_law, crossovers

TP, DP, CP, DOP = Layout.TP, Layout.DP, Layout.CP, Layout.DOP
# Printed in the paper (1k = 1024 tokens): Figure 6 / appendix B.1, Figure 7, Figure 1.
CROSSOVERS_K = {"fig6-dcu": [14.1, 95.7, 197.1], "fig7-h200": [8.8, 59.8, 123.3], "fig1-b200": [18.1, 123.0, 253.4]}
SAMPLED_K = {"fig6-dcu": {TP: 58.9, DP: 232.6, CP: 275.6, DOP: 402.8},
             "fig7-h200": {TP: 36.81, DP: 175.93, CP: 217.73, DOP: 243.48},
             "fig1-b200": {TP: 75.68}}
PRESCRIBED_K = {"fig1-b200": {DP: 400, CP: 450, DOP: 512}}


@functools.lru_cache(maxsize=None)
def limits_of(name: str):
    """Sampling 200,000 cohorts per layout takes about a second: once per scenario."""
    scenario = load("scenario", name)
    return scenario, scenario_limits(scenario.capacity, tuple(compile_law(scenario.timing).costs))


@pytest.fixture(params=sorted(CROSSOVERS_K))
def scenario_and_limits(request):
    return limits_of(request.param)


def test_limits_reproduce_the_paper(scenario_and_limits):
    scenario, limits = scenario_and_limits
    for layout, printed in SAMPLED_K[scenario.name].items():
        assert limits[layout].source == "sampled"
        assert limits[layout].tokens / 1024 == pytest.approx(printed, rel=0.002), layout
    for layout, printed in PRESCRIBED_K.get(scenario.name, {}).items():
        assert limits[layout].source == "prescribed"
        assert limits[layout].tokens == printed * 1024


def test_fastest_feasible_crossovers_reproduce_the_paper(scenario_and_limits):
    scenario, limits = scenario_and_limits
    found = crossovers(compile_law(scenario.timing), {l: v.tokens for l, v in limits.items()}, *scenario.range_tokens)
    switches = [c for c in found if c.after is not None]
    assert [(c.before, c.after) for c in switches] == [(TP, DP), (DP, CP), (CP, DOP)]
    assert [c.tokens / 1024 for c in switches] == pytest.approx(CROSSOVERS_K[scenario.name], abs=0.05)


def test_alpha_is_the_sampled_tp_limit_over_the_reference():
    """Eq 12: α_h = (sampled TP limit of h) / 58.875k, the DCU reference limit."""
    dcu = limits_of("fig6-dcu")[1][TP].tokens
    assert dcu == 58.875 * 1024
    for name in ("fig7-h200", "fig1-b200"):
        scenario, limits = limits_of(name)
        assert scenario.timing.constants["alpha"] == pytest.approx(limits[TP].tokens / dcu, abs=1e-9)


def test_crossovers_cli_json_and_plot(tmp_path, capsys):
    png = tmp_path / "fig7.png"
    path = _write(tmp_path, _small, "fig7-h200")  # fewer cohorts: the crossovers lie below every limit
    assert main(["crossovers", "--scenario", path, "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [round(r["k"], 1) for r in out["crossovers"]] == [8.8, 59.8, 123.3]
    assert "not measurements" in out["note"]
    assert png.stat().st_size > 10_000


def _write(tmp_path, edit, name="fig6-dcu") -> str:
    """A copy of a shipped scenario with ``edit`` applied to its YAML mapping."""
    data = yaml.safe_load(find("scenario", name).read_text())
    edit(data)
    path = tmp_path / f"edited-{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _small(data):
    data["capacity"]["cohorts"] = 2000


@pytest.mark.parametrize("edit,where,reason", [
    (lambda d: d["timing"]["layouts"].update(TP="0.4 + y"), "timing.layouts.TP", "unknown name 'y'"),
    (lambda d: d["timing"]["layouts"].update(CP="2.55 +* x"), "timing.layouts.CP", "cannot parse"),
    (lambda d: d["timing"]["definitions"].update(a="x.real"), "timing.definitions.a", "not allowed"),
    (lambda d: d["timing"].update(argument="L / 1024 / beta"), "timing.argument", "unknown name 'beta'"),
    (lambda d: d["timing"].update(colour="red"), "timing.colour", "unknown key"),
    (lambda d: d["capacity"].update(token_pools={"TP": 10}), "capacity.budget", "exactly one of"),
    (lambda d: d["capacity"].update(output_tokens=[1024, 512]), "capacity.output_tokens", "min <= max"),
    (lambda d: d["capacity"].update(target=1.5), "capacity.target", "(0, 1]"),
    (lambda d: d["capacity"]["budget"].update(attention_weights_gib=60), "capacity.budget", "no KV room"),
    (lambda d: d.update(range_tokens=[5000, 10]), "range_tokens", "0 < lo < hi"),
    (lambda d: d["timing"]["layouts"].update(XP="1"), "timing.layouts.XP", "must be one of"),
])
def test_bad_scenarios_name_file_key_and_reason(tmp_path, edit, where, reason):
    path = _write(tmp_path, edit)
    with pytest.raises(ProfileError) as err:
        load("scenario", path)
    message = str(err.value)
    assert message.startswith(f"{path}: {where}: "), message
    assert reason in message


def test_bad_scenario_on_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    path = _write(tmp_path, lambda d: (_small(d), d["timing"]["layouts"].update(TP="0.4 + y")))
    assert main(["capacity", "--scenario", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "timing.layouts.TP" in err and "(got '0.4 + y')" in err


def test_capacity_cli_table(tmp_path, capsys):
    path = _write(tmp_path, _small)
    assert main(["capacity", "--scenario", path]) == 0
    out = capsys.readouterr().out
    for layout in ("TP", "DP", "CP", "DOP"):
        assert f"\n{layout} " in out
    assert "not a measurement" in out
