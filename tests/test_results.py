"""The results schema: envelope, per-benchmark shapes (docs/results.md), the registry that finds
the shapes through entry points, and the summary helpers."""

from __future__ import annotations

import copy
import json
import re
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest
from result_examples import examples, make

from splash_bench.switch_summary import switch_overhead_summary
from splash_core.results import ResultError, make_result, read_result, read_results, registry, validate, write_result
from splash_core.results.registry import GROUP, ShapeRegistryError, installed, shape_of
from splash_core.results.stats import percentile

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results.md"


@pytest.mark.parametrize("benchmark", sorted(installed().shapes))
def test_every_shape_round_trips_through_a_file(tmp_path, benchmark):
    data = make(benchmark)
    path = write_result(data, tmp_path)
    assert path == tmp_path / "cpu" / f"{benchmark}.json"
    assert read_result(path).data == data
    assert [r.benchmark for r in read_results(tmp_path)] == [benchmark]


def test_writers_without_the_new_arguments_still_work(tmp_path):
    # the original API: a benchmark without a shape, no reference/notes arguments
    data = make_result(benchmark="my_new_bench", platform="h200", backend="hopper", model="deepseek-v3", T=2,
                       dtype="bf16", samples=[1.0, 2.0], summary={"anything": 1}, extra={"rank_count": 2})
    assert read_result(write_result(data, tmp_path, name="x")).data["rank_count"] == 2


def _bad(tmp_path: Path, data: dict, name: str = "bad") -> str:
    path = tmp_path / data["platform"] / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    with pytest.raises(ResultError) as err:
        read_result(path)
    assert str(path) in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("benchmark,mutate,field", [
    ("fixed_layout_sweep", lambda s: s["points"][1].update(layout="tp"), "summary.points[1].layout"),
    ("fixed_layout_sweep", lambda s: s["points"][0].pop("tokens_per_s"), "summary.points[0]: missing field 'tokens_per_s'"),
    ("fixed_layout_sweep", lambda s: s["points"][2].update(batch=0), "summary.points[2].batch"),
    ("fixed_layout_sweep", lambda s: s.update(point=[]), "unknown field 'point'"),
    ("fixed_layout_sweep", lambda s: s.update(points=[]), "summary.points: must be a non-empty list"),
    ("fixed_layout_sweep", lambda s: s["points"].append(dict(s["points"][0])), "summary.points[12]: repeats row 0"),
    ("primitive_costs", lambda s: s["costs"][0].update(state="latent"), "summary.costs[0].state"),
    ("primitive_costs", lambda s: s["costs"][0].update(dst="TP"), "src and dst must differ"),
    ("primitive_costs", lambda s: s["costs"][1].pop("bytes"), "summary.costs[1]: missing field 'bytes'"),
    ("switch_overhead", lambda s: s["directions"][0].update(ready_p50_ms=-1.0), "summary.directions[0].ready_p50_ms"),
    ("switch_overhead", lambda s: s["directions"][0].update(splash_overhead_p50_ms=float("nan")),
     "summary.directions[0].splash_overhead_p50_ms"),
    ("kv_capacity", lambda s: s.update(memory_fraction=1.5), "summary.memory_fraction"),
    ("kv_capacity", lambda s: s["layouts"][0].update(distinct_tokens=True), "summary.layouts[0].distinct_tokens"),
    ("mla_decode", lambda s: s.pop("copy_gbps"), "summary: missing field 'copy_gbps'"),
    ("prefill", lambda s: s["points"][0].update(kernel=""), "summary.points[0].kernel"),
    ("plan_speed", lambda s: s["cases"][0].update(p50_us="fast"), "summary.cases[0].p50_us"),
    ("crossovers", lambda s: s.pop("batch"), "summary.batch: required when axis is input_tokens"),
    ("crossovers", lambda s: s.update(axis="context"), "summary.axis"),
])
def test_a_malformed_summary_names_the_file_and_field(tmp_path, benchmark, mutate, field):
    data = make(benchmark)
    mutate(data["summary"])
    assert field in _bad(tmp_path, data)


DECODE = 'summary.workloads["decode-h16"]'


@pytest.mark.parametrize("benchmark,mutate,field", [
    ("mla_correctness", lambda d: d["samples"][0].update(ok="yes"), "samples[0].ok: must be true or false"),
    ("mla_correctness", lambda d: d["summary"].update(failed=0), "summary.failed: is 0 but 2 sample(s) are not ok"),
    ("mla_correctness", lambda d: d["summary"].update(all_ok=True), "summary.all_ok: is True but 2 check(s) failed"),
    ("kda_correctness", lambda d: d["summary"].update(checks=3), "summary.checks: is 3 but there are 2 samples"),
    ("runtime_equivalence", lambda d: d["samples"][1].update(rel_err=0.5),
     "samples[1].passed: is True but rel_err 0.5 against tolerance 0.05"),
    ("runtime_equivalence", lambda d: d["samples"][0].update(decisive_mismatches=1),
     "samples[0].decisive_mismatches: more than its greedy_mismatches"),
    ("runtime_equivalence", lambda d: d["samples"][0].update(layout="DP-attention"), "samples[0].layout"),
    ("runtime_equivalence", lambda d: d["summary"].update(failed=["tiny-mla/TP"]), "summary.failed: lists"),
    ("conformance", lambda d: d["summary"].update(other=True), "summary.other: is True but samples[1] exited with 1"),
    ("conformance", lambda d: d["summary"].update(third=True), "summary: names backends"),
    ("conformance", lambda d: d["summary"].update(other="no"), "summary.other: must be true or false"),
    ("conformance", lambda d: d.update(summary={}), "summary: must be a non-empty object of names"),
    ("conformance", lambda d: d["samples"][0].update(returncode="0"), "samples[0].returncode: must be an integer"),
    ("gpu_rates", lambda d: d["summary"].pop("copy_gbps"), "summary: missing field 'copy_gbps'"),
    ("mla_kernel_sweep", lambda d: d["summary"]["workloads"]["decode-h16"]["winner_ms"].pop(),
     f"{DECODE}.winner_ms: has 1 values for 2 points"),
    ("mla_kernel_sweep", lambda d: d["summary"]["workloads"]["decode-h16"]["points"][0].append(1),
     f"{DECODE}.points: must be a non-empty list of [integer > 0, integer > 0] pairs"),
    ("mla_kernel_sweep", lambda d: d["summary"]["workloads"]["decode-h16"]["winner_rates"][0].update(kv=1.0),
     f"{DECODE}.winner_rates: must be a non-empty list of objects of rate names"),
    ("mla_kernel_sweep", lambda d: d["summary"]["workloads"]["decode-h16"].pop("winner_ms"),
     f"{DECODE}: winner needs winner_ms"),
    ("mla_kernel_sweep", lambda d: d["summary"]["workloads"]["decode-h16"].update(best="x"), "unknown field 'best'"),
    ("mla_kernel_sweep", lambda d: d["summary"]["workloads"].update(prefill=d["summary"]["workloads"]["extend-h16"]),
     "summary.workloads[\"prefill\"]: a workload's name starts with its kernel entry"),
    ("mla_kernel_sweep", lambda d: d["summary"].update(workloads={}), "summary.workloads: must be a non-empty object"),
    ("mla_kernel_sweep", lambda d: d["summary"].update(tiles={"decode": ""}), "summary.tiles: must be a non-empty"),
    ("mla_kernel_sweep", lambda d: d["samples"][0].update(workload="decode-h64"),
     "samples[0].workload: 'decode-h64' is not in summary.workloads"),
    ("runtime_step", lambda d: d["summary"]["points"][0].update(phase="extend"),
     "summary.points[0].phase: must be decode or prefill"),
    ("runtime_step", lambda d: d["summary"]["points"][0].update(median_ms=99.0),
     "summary.points[0].median_ms: is 99.0 but its samples' median is 10.0"),
    ("runtime_step", lambda d: d["summary"]["memory"].pop("budget_bytes"),
     "summary.memory: missing field 'budget_bytes'"),
    ("runtime_step", lambda d: d["summary"]["memory"]["per_layer_bytes"].update(TP=-1),
     "summary.memory.per_layer_bytes: must be a non-empty object of names to integers >= 0"),
    ("runtime_step", lambda d: d["samples"][0].update(step_ms=[]), "samples[0].step_ms: must be a non-empty list"),
])
def test_a_malformed_device_result_names_the_file_and_field(tmp_path, benchmark, mutate, field):
    data = make(benchmark)
    mutate(data)
    assert field in _bad(tmp_path, data)


@pytest.mark.parametrize("benchmark", ["mla_correctness", "gpu_rates", "runtime_step", "conformance"])
def test_device_results_are_measurements_only(tmp_path, benchmark):
    data = make(benchmark)
    data.update(source="paper", reference="Table 1")
    assert f"source: {benchmark} results must be measured (got 'paper')" in _bad(tmp_path, data)


def test_a_sample_missing_its_fields_is_named(tmp_path):
    data = make("switch_overhead")
    del data["samples"][4]["splash_ms"]
    assert "samples[4]: missing field 'splash_ms'" in _bad(tmp_path, data)


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.pop("T"), "missing field 'T'"),
    (lambda d: d.update(T="2"), "field 'T' must be an integer"),
    (lambda d: d.update(source="guess"), "field 'source' must be one of measured, paper, model"),
    (lambda d: d.update(samples=[]), "field 'samples': a measured result needs its raw samples"),
    (lambda d: d.update(source="paper", samples=[]), "field 'reference': a paper result must name its table"),
    (lambda d: d.update(notes=3), "field 'notes' must be a str"),
])
def test_a_malformed_envelope_names_the_field(tmp_path, mutate, message):
    data = make("plan_speed")
    mutate(data)
    assert message in _bad(tmp_path, data)


def test_predictions_are_never_labelled_measured(tmp_path):
    data = make("crossovers", samples=[{"at": 1}])
    data["source"] = "measured"
    assert "source: crossovers results must be model or paper" in _bad(tmp_path, data)


def test_a_paper_result_needs_no_samples_but_its_reference():
    data = make("kv_capacity", source="paper", samples=[], reference="Table 3")
    validate(data, "x")
    assert data["reference"] == "Table 3"


def test_measured_only_fields_are_optional_for_paper_numbers():
    data = make("primitive_costs", source="paper", samples=[], reference="Figure 5b/c")
    for row in data["summary"]["costs"]:
        row.pop("bytes"), row.pop("primitive")
    validate(data, "x")


def test_invalid_json_names_file_and_line(tmp_path):
    path = tmp_path / "cpu" / "broken.json"
    path.parent.mkdir()
    path.write_text('{"schema": 1,\n  "benchmark": }')
    with pytest.raises(ResultError, match=re.escape(str(path)) + ": not valid JSON at line 2"):
        read_result(path)


def test_a_file_in_the_wrong_platform_folder_is_rejected(tmp_path):
    data = make("plan_speed", platform="cpu")
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "plan_speed.json").write_text(json.dumps(data))
    with pytest.raises(ResultError, match="field 'platform' is 'cpu' but the file is in folder 'h200'"):
        read_results(tmp_path)


def test_make_result_refuses_to_build_a_malformed_result():
    summary, samples = copy.deepcopy(examples()["kv_capacity"])
    summary["layouts"][0]["layout"] = "DP-attention"
    with pytest.raises(ResultError, match=r"<new result>: summary.layouts\[0\].layout: must be one of TP, CP, DP, DOP"):
        make_result(benchmark="kv_capacity", platform="cpu", backend="reference", model="m", T=2, dtype="fp32",
                    samples=samples, summary=summary)


@pytest.mark.parametrize("q", [0, 5, 50, 95, 100])
def test_percentile_is_numpys_linear_definition(q):
    values = [3.0, 1.0, 7.5, 2.25, 9.0, 4.0, 11.0]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_switch_overhead_summary_differences_matched_runs():
    runs = [(10.0, 30.0, 11.0), (12.0, 20.0, 12.5), (11.0, 50.0, 14.0), (13.0, 33.0, 13.0)]
    samples = [{"src": "TP", "dst": "DP", "ready_ms": r, "blocking_ms": b, "splash_ms": s} for r, b, s in runs]
    (row,) = switch_overhead_summary(samples)
    blocking = [b - r for r, b, _ in runs]
    splash = [s - r for r, _, s in runs]
    assert row["ready_p50_ms"] == pytest.approx(np.percentile([r for r, _, _ in runs], 50))
    assert row["blocking_overhead_p50_ms"] == pytest.approx(np.percentile(blocking, 50))
    assert row["blocking_overhead_p95_ms"] == pytest.approx(np.percentile(blocking, 95))
    assert row["splash_overhead_p95_ms"] == pytest.approx(np.percentile(splash, 95))
    assert row["runs"] == 4 and (row["src"], row["dst"]) == ("TP", "DP")
    # a per-run difference, not a difference of quantiles
    assert row["splash_overhead_p50_ms"] != pytest.approx(row["splash_p50_ms"] - row["ready_p50_ms"])


def test_the_contract_document_lists_every_benchmark_and_field():
    text = DOCS.read_text()
    for name, shape in installed().shapes.items():
        assert f"`{name}`" in text, name
        fields = set(shape.summary) | set(shape.sample) | {f for rows in shape.rows.values() for f in rows}
        for field in fields:
            assert f"`{field}`" in text, f"{name}.{field} is not documented in {DOCS}"


def test_git_commit_prefers_the_senders_record(monkeypatch, tmp_path):
    """A device machine runs a copy of the tree whose git metadata may be stale: the commit the
    sender recorded wins; without it, a directory outside any checkout is 'unknown'."""
    from splash_core.results import git_commit

    monkeypatch.setenv("SPLASH_GIT_COMMIT", "abc1234")
    assert git_commit() == "abc1234"
    monkeypatch.delenv("SPLASH_GIT_COMMIT")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert git_commit(tmp_path) == "unknown"
    assert git_commit() != "unknown"  # this checkout


# ---- the registry: shapes come from the entry points of group splash.result_shapes ----------

CORE_BENCHMARKS = {"fixed_layout_sweep", "primitive_costs", "switch_overhead", "kv_capacity", "crossovers"}


def test_the_registry_finds_the_core_and_bench_shapes_through_entry_points():
    from splash_bench.shapes import gpu_kernels
    from splash_core.studies import result_shapes

    found = installed()
    assert set(found.shapes) == set(examples())  # every benchmark with an example, and no other
    for name in found.shapes:
        owner = "'studies' (splash_core.studies.result_shapes:SHAPES) of splash-serve" if name in CORE_BENCHMARKS \
            else "(splash_bench.shapes."
        assert owner in found.origins[name], (name, found.origins[name])
    assert shape_of("fixed_layout_sweep") is result_shapes.SHAPES["fixed_layout_sweep"]
    assert shape_of("mla_decode") is gpu_kernels.SHAPES["mla_decode"]


PLANTED = """
from splash_core.results.shapes import Shape

NEW = {"planted_bench": Shape(doc="planted", summary={"points": "rows"}, rows={"points": {"ms": "nonneg"}})}
TWIN = {"mla_decode": Shape(doc="a second mla_decode", summary={"ms": "nonneg"})}
LISTED = ["planted_bench"]
UNNAMED = {"": NEW["planted_bench"]}
MISSPELT = {"planted_bench": Shape(doc="planted", summary={"ms": "nonnegative"})}
NESTED = {"planted_bench": Shape(doc="planted", summary={"ms": "nonneg"}, sample={"runs": "rows"})}
UNLISTED = {"planted_bench": Shape(doc="planted", summary={"points": "rows"})}
STRAY = {"planted_bench": Shape(doc="planted", summary={"ms": "nonneg"}, rows={"ms": {"x": "nonneg"}})}
"""


@pytest.fixture
def plant(monkeypatch, tmp_path):
    """plant(name, value): the installed entry points plus one more, as if another distribution
    registered it; the registry is loaded afresh before and after."""
    (tmp_path / "planted_shapes.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "planted_shapes", raising=False)
    listed = registry._listed

    def plant(name: str, value: str) -> None:
        monkeypatch.setattr(registry, "_listed", lambda: [*listed(), EntryPoint(name, value, GROUP)])
        installed.cache_clear()

    yield plant
    monkeypatch.undo()
    installed.cache_clear()


def test_a_new_distribution_registers_a_shape_with_an_entry_point(plant):
    data = make_result(benchmark="planted_bench", platform="cpu", backend="reference", model="m", T=1, dtype="fp32",
                       samples=[{}], summary={"points": [{"ms": -1.0}]})  # no shape yet: envelope only
    plant("planted", "planted_shapes:NEW")
    with pytest.raises(ResultError, match=r"x: summary.points\[0\].ms: must be a finite number >= 0"):
        validate(data, "x")
    assert "'planted' (planted_shapes:NEW)" in installed().origins["planted_bench"]


def test_a_benchmark_registered_twice_names_both_entry_points(plant):
    plant("twin", "planted_shapes:TWIN")
    with pytest.raises(ShapeRegistryError) as err:
        validate(make("kv_capacity"), "x")  # any result: the registry loads as a whole
    message = str(err.value)
    assert "benchmark 'mla_decode' is registered twice" in message
    assert "'gpu_kernels' (splash_bench.shapes.gpu_kernels:SHAPES) of splash-bench" in message
    assert "'twin' (planted_shapes:TWIN)" in message


def test_one_mapping_found_twice_is_one_registration(plant):
    """A distribution seen twice on the path lists its entry point twice: the same shapes, no conflict."""
    plant("gpu_kernels", "splash_bench.shapes.gpu_kernels:SHAPES")
    validate(make("mla_decode"), "x")
    assert "of splash-bench" in installed().origins["mla_decode"]


@pytest.mark.parametrize("value,reason", [
    ("no_such_module_of_shapes:SHAPES", "failed to load: ModuleNotFoundError: No module named 'no_such_module_of_shapes'"),
    ("planted_shapes:ABSENT", "failed to load: AttributeError"),
    ("planted_shapes:LISTED", "names a list, not a mapping of benchmark names to Shapes"),
    ("planted_shapes:UNNAMED", "benchmark name '' must be a non-empty string"),
    ("planted_shapes:MISSPELT", "the shape of 'planted_bench' uses the unknown kind 'nonnegative'"),
    ("planted_shapes:NESTED", "the shape of 'planted_bench' uses the container 'rows' outside summary"),
    ("planted_shapes:UNLISTED", "summary key 'points': a container must list its fields in rows"),
    ("planted_shapes:STRAY", "summary key 'ms': a container must list its fields in rows, and only a container"),
])
def test_a_broken_entry_point_is_an_error_naming_it(plant, value, reason):
    plant("broken", value)
    with pytest.raises(ShapeRegistryError) as err:
        make("kv_capacity")
    assert f"{GROUP} entry point 'broken' ({value})" in str(err.value)
    assert reason in str(err.value)


def test_a_benchmark_without_a_registered_shape_gets_the_envelope_checks_alone():
    data = make_result(benchmark="unregistered_bench", platform="cpu", backend="reference", model="m", T=1,
                       dtype="fp32", samples=[{"any": "thing"}], summary={"points": "not rows", "x": [None]})
    assert shape_of("unregistered_bench") is None
    validate(data, "x")
    for mutate, message in ((lambda d: d.pop("T"), "missing field 'T'"),
                            (lambda d: d.update(samples=[]), "a measured result needs its raw samples")):
        bad = copy.deepcopy(data)
        mutate(bad)
        with pytest.raises(ResultError, match=message):
            validate(bad, "x")

