"""`splash report`: renders from committed files alone, every section for every platform,
paper and measured numbers labelled and equal to their inputs, clear errors for bad files."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from result_examples import examples, make, write_all

from splash_core.cli.main import main
from splash_core.report.sections import SECTIONS
from splash_core.results import make_result, write_result

REFERENCE = Path(__file__).resolve().parents[1] / "bench" / "reference"
CHAPTERS = {"b200": "B200", "h200": "H200", "dcu": "DCU (BW1000)", "cpu": "CPU (reference backend)"}
PAPER = {"b200": "B200/GLM-5.3", "h200": "H200/DeepSeek-V3.2", "dcu": "DCU-BW1000/GLM-5.3-Flash"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Example results of every benchmark on cpu and h200x2, rendered once with --json."""
    root = tmp_path_factory.mktemp("rendered")
    results, out = root / "results", root / "report"
    write_all(results, "cpu")
    write_all(results, "h200x2")
    write_result(make_result_without_renderer(), results)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["report", "--results", str(results), "--reference", str(REFERENCE), "--out", str(out), "--json"])
    assert rc == 0
    return (out / "README.md").read_text(), out, json.loads(stdout.getvalue())


def make_result_without_renderer() -> dict:
    return make_result(benchmark="rollout_throughput", platform="cpu", backend="reference", model="tiny-mla", T=2,
                       dtype="fp32", samples=[1.0], summary={"ratio": 1.1}, machine="test machine", command="pytest")


def chapter(md: str, key: str) -> str:
    return re.search(rf"^## {re.escape(CHAPTERS[key])}\n(.*?)(?=^## |\Z)", md, re.S | re.M)[1]


def section(text: str, title: str) -> str:
    return re.search(rf"^### {re.escape(title)}\n(.*?)(?=^### |\Z)", text, re.S | re.M)[1]


def part(text: str, title: str) -> str:
    """A part of a grouped section, from its '#### ' heading."""
    return re.search(rf"^#### {re.escape(title)}\n(.*?)(?=^#### |\Z)", text, re.S | re.M)[1]


def section_of(text: str, s) -> str:
    """The text of Section ``s`` in a chapter: a section of its own, or a part of its group."""
    return part(section(text, s.group), s.title) if s.group else section(text, s.title)


def blocks(text: str, level: int = 4) -> list[str]:
    """The labelled result blocks of a section, each from its heading ('#### ', '##### ' in a part)."""
    mark = "#" * level + " "
    return [mark + b for b in re.split(rf"^{mark}", text, flags=re.M)[1:]]


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table in ``text``: rows of cells without the header and rule, bold removed."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append([c.strip().replace("**", "") for c in line.strip().strip("|").split("|")])
        elif current:
            found.append(current[2:])
            current = []
    return found


def number(cell: str) -> float:
    return float(cell.replace(",", "").replace("%", ""))


def csv_rows(name: str, platform_prefix: str) -> list[dict]:
    with (REFERENCE / name).open() as f:
        return [r for r in csv.DictReader(f) if r["platform"].startswith(platform_prefix)]


def not_measured(md: str, key: str) -> dict[str, list[str]]:
    """The one "Not measured" list's entries for a platform: 'measured' (not measured on this
    platform) and 'model' (no cost-model prediction) -> the section names given."""
    listing = md.split("\n## Not measured\n", 1)[1].split("\n## ", 1)[0]
    item = re.search(rf"^- \*\*{re.escape(CHAPTERS[key])}\*\* .*\n((?:  - .*\n?)*)", listing, re.M)
    found: dict[str, list[str]] = {}
    for line in (item[1] if item else "").splitlines():
        kind = "model" if "no cost-model prediction for this platform" in line else "measured"
        assert "not measured on this platform" in line or kind == "model", line
        found[kind] = line.split(": ", 1)[1].rstrip(".").split("; ")
    return found


def named(names: list[str], s) -> bool:
    """Whether the list names section ``s`` (alone, or with the sources it still shows in parentheses)."""
    return any(n == s.label or n.startswith(f"{s.label} (") for n in names)


def test_every_platform_has_every_section_and_says_what_is_missing(rendered):
    md, _, status = rendered
    assert md.startswith("# SPLASH benchmark report")
    for key in CHAPTERS:
        text, missing = chapter(md, key), not_measured(md, key)
        for s in SECTIONS:
            labels = status["status"][key][s.benchmark]
            own = any(label.startswith(f"{s.produced_by} ") for label in labels)
            assert named(missing.get(s.produced_by, []), s) != own, (key, s.title)  # listed once, exactly when missing
            shown = re.search(rf"^#{{3,4}} {re.escape(s.title)}\n", text, re.M) is not None
            assert shown == bool(labels), (key, s.title)  # a section with no block at all is left out
        assert set(status["status"][key]) == {s.benchmark for s in SECTIONS}
    for key in ("b200", "dcu"):  # nothing of ours on B200 or DCU: the list names every section, the rest is paper
        missing = not_measured(md, key)
        assert all(named(missing[s.produced_by], s) for s in SECTIONS)
        for s in SECTIONS:
            if status["status"][key][s.benchmark]:
                assert all(b.startswith("#### paper:") for b in blocks(section_of(chapter(md, key), s), 5 if s.group else 4))
    overview = md.split("## Overview", 1)[1].split("\n## ", 1)[0]
    assert [r[0] for r in tables(overview)[0]] == [s.label for s in SECTIONS]


def test_paper_and_measured_blocks_are_labelled_and_kept_apart(rendered):
    md, _, status = rendered
    h200 = section(chapter(md, "h200"), "Fixed-layout throughput sweeps")
    paper, measured = blocks(h200)
    assert paper.startswith("#### paper: Table 6, Figure 10") and "**paper** — Table 6, Figure 10 of the SPLASH paper" in paper
    assert "**measured** — h200x2" in measured and "paper" not in measured.split("\n", 3)[2]
    assert status["status"]["h200"]["fixed_layout_sweep"] == ["paper (T = 8)", "measured (h200x2: T = 2 on test machine)"]
    assert "**paper**" not in chapter(md, "cpu")
    crossovers = section(chapter(md, "cpu"), "Predicted vs measured crossovers")
    assert "**model (computed by SPLASH's cost model, not a measurement)**" in crossovers
    for key in ("b200", "dcu"):
        assert "**measured**" not in chapter(md, key)


def test_paper_sweep_tables_equal_the_reference_csv(rendered):
    md, _, _ = rendered
    for key, label in PAPER.items():
        paper = blocks(section(chapter(md, key), "Fixed-layout throughput sweeps"))[0]
        rendered_rows = [row for t in tables(paper) for row in t]
        expected = csv_rows("fixed_layout_sweeps.csv", label)
        assert len(rendered_rows) == len(expected)
        for row, ref in zip(rendered_rows, expected):
            values = {l: float(ref[l]) * 1000 for l in ("TP", "CP", "DP", "DOP")}
            assert [number(c) for c in row[2:6]] == pytest.approx(list(values.values()), abs=1e-6)
            assert row[6] == max(values, key=values.get)
            assert {number(row[0]), number(row[1])} == {float(ref["input_tokens"]), float(ref["batch"])}


def test_paper_switch_capacity_and_primitive_tables_equal_the_reference_csv(rendered):
    md, _, _ = rendered
    for key, label in PAPER.items():
        text = chapter(md, key)
        (switch,) = tables(blocks(section(text, "Switch overhead"))[0])
        by_direction = {r[0]: r for r in switch}
        for ref in csv_rows("switch_overheads.csv", label):
            row = by_direction[f"{ref['src']} → {ref['dst']}"]
            assert [number(c) for c in row[1:4]] == [float(ref[k]) for k in ("ready_p50_ms", "blocking_p50_ms", "splash_p50_ms")]
            assert row[4] == f"{float(ref['blocking_overhead_p50_ms']):,.2f} ({float(ref['blocking_overhead_p95_ms']):,.2f})"
            assert row[5] == f"{float(ref['splash_overhead_p50_ms']):,.2f} ({float(ref['splash_overhead_p95_ms']):,.2f})"
        (capacity,) = tables(blocks(section(text, "KV capacity per layout"))[0])
        for row, ref in zip(sorted(capacity), sorted(csv_rows("kv_capacity.csv", label), key=lambda r: r["layout"])):
            assert row[0] == ref["layout"]
            assert [number(c) for c in row[1:4]] == [float(ref["pool_gib_per_card"]), float(ref["pool_gib_per_group"]),
                                                     float(ref["distinct_tokens"])]
        weights, kv = tables(blocks(section(text, "Switch primitive costs"))[0])
        for ref in csv_rows("primitive_costs.csv", label):
            matrix = weights if ref["state"] == "weights" else kv
            row = next(r for r in matrix if r[0] == ref["src"])
            assert number(row[1 + ("TP", "CP", "DP", "DOP").index(ref["dst"])]) == float(ref["per_layer_ms"])


def test_paper_crossovers_meet_the_paper_sweeps(rendered):
    md, _, _ = rendered
    (rows,) = tables(blocks(section(chapter(md, "b200"), "Predicted vs measured crossovers"))[0])
    # Figure 1's 18.1k falls outside the sampled TP->DP change; its last two fall between, as §5.2 says
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("TP → DP", "18,534 (18.1K)", "4,096 – 16,384", "no"),
        ("DP → CP", "125,952 (123.0K)", "65,536 – 131,072", "yes"),
        ("CP → DOP", "259,482 (253.4K)", "131,072 – 262,144", "yes"),
    ]


def test_measured_tables_equal_their_inputs(rendered):
    md, _, _ = rendered
    ex = examples()
    cpu = chapter(md, "cpu")
    (sweep,) = tables(section(cpu, "Fixed-layout throughput sweeps"))
    points = {(p["layout"], p["input_tokens"]): p["tokens_per_s"] for p in ex["fixed_layout_sweep"][0]["points"]}
    for row in sweep:
        assert [number(c) for c in row[2:6]] == [points[(l, number(row[0]))] for l in ("TP", "CP", "DP", "DOP")]
    (switch,) = tables(section(cpu, "Switch overhead"))
    for row, d in zip(switch, ex["switch_overhead"][0]["directions"]):
        assert row[0] == f"{d['src']} → {d['dst']}"
        assert [number(c) for c in row[1:4]] == pytest.approx([d["ready_p50_ms"], d["blocking_p50_ms"], d["splash_p50_ms"]], abs=0.005)
        assert number(row[5].split()[0]) == pytest.approx(d["splash_overhead_p50_ms"], abs=0.005)
    (capacity,) = tables(section(cpu, "KV capacity per layout"))
    assert [(r[0], number(r[1]), number(r[3])) for r in capacity] == [
        (l["layout"], l["pool_bytes_per_rank"] / 2**30, l["distinct_tokens"])
        for l in sorted(ex["kv_capacity"][0]["layouts"], key=lambda l: ("TP", "DOP", "CP", "DP").index(l["layout"]))]
    (decode,) = tables(section(cpu, "MLA decode bandwidth against the roofline"))
    assert [(number(r[2]), number(r[3]), number(r[4])) for r in decode] == [
        (p["context"], p["time_ms"], p["achieved_gbps"]) for p in ex["mla_decode"][0]["points"]]
    (timing,) = tables(section(cpu, "Scheduler decision speed"))
    case = ex["scheduler_speed"][0]["cases"][0]
    assert timing == [[case["case"], f"{case['p50_us']:.1f}", f"{case['p95_us']:.1f}", str(case["runs"])]]
    (crossovers,) = tables(section(cpu, "Predicted vs measured crossovers"))
    assert [r[3] for r in crossovers] == ["yes", "no"]  # 2,000 in 1,024-4,096; 20,000 not in 4,096-16,384
    (precopy,) = tables(part(section(cpu, "Host time"), "Host work of a pre-copy across steps"))
    assert precopy == [["DP→TP", "150.00", "162.50", "12.50", "15.50", "240.00", "330.00", "1.00", "16.00", "0", "5"]]


def test_overview_chapters_and_sections_name_source_t_and_machine(rendered):
    md, _, _ = rendered
    overview = {r[0]: r[1:] for r in tables(md.split("## Overview", 1)[1].split("\n## ", 1)[0])[0]}
    # columns: B200, H200, DCU, CPU
    assert overview["Fixed-layout throughput sweeps"][1] == "paper (T = 8), measured (h200x2: T = 2 on test machine)"
    assert overview["Runtime step times"] == ["not measured", "measured (h200x2: T = 2 on test machine)",
                                              "not measured", "measured (cpu: T = 2 on test machine)"]
    assert overview["Correctness on the device: Conformance suite per backend"][3].startswith("measured (cpu: T = 2")
    h200 = chapter(md, "h200")
    assert "- **paper** — the paper's deployment: T = 8, 8x NVIDIA H200 prefill instance, 1P1D" in h200
    assert "- **measured** — h200x2: T = 2, test machine; model tiny-mla." in h200
    for title in ("Fixed-layout throughput sweeps", "Correctness on the device", "Kernel tuning"):
        assert section(h200, title).startswith("\n*Numbers here:* "), title
    assert "*Numbers here:* paper (T = 8; 8x NVIDIA H200 prefill instance, 1P1D); measured (h200x2: T = 2 on " \
           "test machine)." in section(h200, "Switch overhead")


def test_correctness_sections_equal_their_inputs(rendered):
    md, _, _ = rendered
    correctness = section(chapter(md, "cpu"), "Correctness on the device")
    (mla,) = tables(part(correctness, "MLA kernels vs the torch reference"))
    assert mla == [["generic", "16", "0.00195 / 1.91e-06", "equal", "yes"],  # largest over the short and long case
                   ["wide", "128", "FAILED 0.25 / 0.125", "FAILED (not equal)", "FAILED"]]
    (kda,) = tables(part(correctness, "KDA kernels (fla) vs the torch recurrence"))
    assert [r[:4] for r in kda] == [["kda.chunk", "0.00391", "0.00781", "yes"], ["kda.step", "0.00195", "0", "yes"]]
    equivalence = part(correctness, "Runtime per layout vs a float32 reference")
    (rows,) = tables(equivalence)
    assert [(r[1], number(r[2]), r[5], r[6], r[8]) for r in rows] == [("TP", 0.0075, "0", "0", "yes"),
                                                                        ("DOP", 0.0075, "2", "0", "yes")]
    assert "≤ 0.05 × max |reference logit|" in equivalence and "Every layout passed." in equivalence
    (suite,) = tables(part(correctness, "Conformance suite per backend"))
    assert suite == [["reference", "2", "18 / 20", "0", "2", "0", "yes", "12"],
                     ["other", "n/a", "17 / 20", "3", "0", "1", "FAILED", "3"]]


def test_tuning_and_step_sections_equal_their_inputs(rendered):
    md, _, status = rendered
    cpu = chapter(md, "cpu")
    sweep_part = part(section(cpu, "Kernel tuning"), "Attention tile sweep")
    overview, points = tables(sweep_part)
    assert overview == [["decode-h16", "16", "3 (1 failed, 0 skipped)", "`r1h16k64`", "`r1h16k32` (abc1234)",
                         "1.50x – 2.00x"],
                        ["extend-h16", "16", "1 (1 failed, 0 skipped)", "none", "n/a", "n/a"]]
    # shares of the ceilings of the same command: copy 30 GB/s, matmul 1.5 TFLOP/s
    assert points[0] == ["decode-h16", "B 16, 4K", "0.50", "24 (80%)", "0.75 (50%)", "1.00", "12 (40%)",
                         "0.375 (25%)", "2.00x"]
    assert points[2][:3] == ["extend-h16", "256 rows, 2K", "n/a"]
    (ceilings,) = tables(part(section(cpu, "Kernel tuning"), "Measured device ceilings (the rooflines)"))
    assert [r[1] for r in ceilings] == ["30 GB/s", "1.5 TFLOP/s"]
    assert ceilings[0][2].endswith("mla_decode.json` (same value)")
    assert ceilings[1][2].endswith("prefill.json` (its own run: 0.2 TFLOP/s)")
    steps = section(cpu, "Runtime step times")
    (rows,) = tables(steps)
    assert rows == [["decode", "1,024", "4", "4", "10.00", "13.00", "n/a", "n/a", "TP"],  # medians of the samples
                    ["decode", "4,096", "4", "4", "12.50", "11.00", "n/a", "n/a", "CP"],
                    ["prefill", "1,024", "4", "32", "21.00", "25.00", "n/a", "n/a", "TP"]]
    assert "3 layers of tiny-mla per step (5 fit" in steps and "Skipped (time budget): CP/prefill/4096." in steps
    assert "![runtime step times](cpu-measured-steps.png)" in steps and "cpu-measured-steps.png" in status["images"]


def test_a_device_result_disagreeing_with_its_samples_is_a_one_line_error(tmp_path, capsys):
    bad = make("runtime_step")
    bad["summary"]["points"][1]["median_ms"] = 12.0
    path = write_raw(tmp_path / "results", bad)
    rc = main(["report", "--results", str(tmp_path / "results"), "--reference", str(REFERENCE),
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert f"{path}: summary.points[1].median_ms: is 12.0 but its samples' median is 13.0" in err


def write_raw(root: Path, data: dict) -> Path:
    """Write ``data`` without validating it, where read_results looks for it."""
    path = root / data["platform"] / f"{data['benchmark']}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    return path


def test_images_are_linked_present_and_small(rendered):
    md, out, status = rendered
    linked = re.findall(r"\]\(([^)]+\.png)\)", md)
    assert sorted(linked) == sorted(status["images"]) and len(set(linked)) == len(linked)
    assert sorted(p.name for p in out.glob("*.png")) == sorted(linked)
    for name in linked:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sum((out / n).stat().st_size for n in linked) < 600_000


def test_unknown_benchmarks_are_listed_not_dropped(rendered):
    md, _, status = rendered
    listing = md.split("## Results without a renderer", 1)[1].split("\n## ", 1)[0]
    assert "rollout_throughput" in listing and "rollout_throughput.json" in listing
    assert status["unrendered"][0].endswith("rollout_throughput.json")


def test_a_malformed_results_file_is_a_one_line_error_naming_file_and_field(tmp_path, capsys):
    bad = make("kv_capacity")
    bad["summary"]["layouts"][1]["distinct_tokens"] = -5
    path = tmp_path / "results" / "cpu" / "kv_capacity.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(bad))
    rc = main(["report", "--results", str(tmp_path / "results"), "--reference", str(REFERENCE), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert f"{path}: summary.layouts[1].distinct_tokens: must be an integer >= 0 (got -5)" in err
    assert not (tmp_path / "o" / "README.md").exists()


def test_a_missing_results_folder_given_explicitly_is_an_error(tmp_path, capsys):
    rc = main(["report", "--results", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"splash report: error: argument --results: {tmp_path / 'nope'}: directory does not exist\n"


def test_bad_reference_data_names_file_and_line(tmp_path, capsys):
    reference = tmp_path / "reference"
    shutil.copytree(REFERENCE, reference)
    path = reference / "kv_capacity.csv"
    path.write_text(path.read_text().replace("H200/DeepSeek-V3.2,0.9,CP,22.93", "H200/DeepSeek-V3.2,0.9,CP,lots"))
    (tmp_path / "results").mkdir()
    rc = main(["report", "--results", str(tmp_path / "results"), "--reference", str(reference), "--out", str(tmp_path / "o")])
    assert rc == 2 and f"{path}:8: column 'pool_gib_per_card' is not a number" in capsys.readouterr().err


def headers_only_reference(tmp_path: Path) -> Path:
    """The reference folder with the paper's rows removed: a valid, fast-rendering reference."""
    reference = tmp_path / "reference"
    shutil.copytree(REFERENCE, reference)
    for path in reference.glob("*.csv"):
        path.write_text(path.read_text().splitlines()[0] + "\n")
    return reference


def test_rerendering_removes_only_its_own_stale_images(tmp_path):
    results, out = tmp_path / "results", tmp_path / "report"
    for benchmark in ("mla_decode", "prefill"):
        write_result(make(benchmark), results)
    reference = headers_only_reference(tmp_path)
    args = ["report", "--results", str(results), "--reference", str(reference), "--out", str(out)]
    assert main(args) == 0
    before = {p.name for p in out.glob("*.png")}
    (out / "keep.png").write_bytes(b"not ours")
    (results / "cpu" / "prefill.json").unlink()
    assert main(args) == 0
    after = {p.name for p in out.glob("*.png")}
    gone = before - after
    assert len(gone) == 1 and "prefill" in gone.pop()
    assert "keep.png" in after
    md = (out / "README.md").read_text()
    prefill = next(s for s in SECTIONS if s.benchmark == "prefill")
    assert named(not_measured(md, "cpu")["measured"], prefill)
    assert f"### {prefill.title}" not in chapter(md, "cpu")


def test_without_a_results_folder_the_report_says_nothing_was_measured(tmp_path):
    from splash_core.report import render_report

    report = render_report(None, tmp_path / "o", headers_only_reference(tmp_path))
    assert "no results folder `bench/results` (nothing measured yet)" in report.markdown
    assert all(labels == [] for chapter_status in report.status.values() for labels in chapter_status.values())
    for key in CHAPTERS:  # every section on every platform, named once in the list, none as a stub
        missing = not_measured(report.markdown, key)
        assert all(named(missing[s.produced_by], s) for s in SECTIONS)
        assert not re.search(r"^### ", chapter(report.markdown, key), re.M)


def test_the_committed_results_render(tmp_path):
    """Every file under bench/results is valid and the report renders from them (the CI check
    that keeps the committed report reproducible)."""
    from splash_core.report import render_report

    committed = REFERENCE.parent / "results"
    report = render_report(committed if committed.is_dir() else None, tmp_path / "o", REFERENCE)
    paper_sections = ("fixed_layout_sweep", "crossovers", "primitive_costs", "switch_overhead", "kv_capacity")
    for key in PAPER:
        assert all("paper (T = 8)" in report.status[key][b] for b in paper_sections), key
    assert all((tmp_path / "o" / name).is_file() for name in report.images)
    # the device results of the H200 runs render in their sections, labelled with T and the machine
    h200 = report.status["h200"]
    for benchmark in ("mla_correctness", "runtime_equivalence", "conformance", "mla_kernel_sweep", "gpu_rates",
                      "runtime_step"):
        assert h200[benchmark] and all(label.startswith("measured (h200: T = ") for label in h200[benchmark])
    steps = h200["runtime_step"]  # the T = 2 steps and the T = 1 device-bound grid both render
    assert any(label.startswith("measured (h200: T = 2 on 2x ") for label in steps), steps
    assert any(label.startswith("measured (h200: T = 1, one device") for label in steps), steps
    assert not [path for path in report.unrendered if "/h200/" in path]
    text = chapter(report.markdown, "h200")
    assert "- **paper** — the paper's deployment: T = 8" in text
    assert "![runtime step times](h200-measured-steps.png)" in section(text, "Runtime step times")


def test_transport_probe_rows_show_times_slowdown_and_device_work():
    """One row per transport and collective; a collective that failed shows its error."""
    from splash_core.report import transport
    from splash_core.results import Result

    ok = {"transport": "ce", "op": "allgather_kv", "alone_ms": 1.0, "repeat": 10, "matmul_alone_ms": 30.0,
          "matmul_with_ms": 33.0, "matmul_slowdown_pct": 10.0, "collectives_beside_ms": 8.0,
          "collective_slowdown_pct": -20.0, "kernels": ["Memcpy PtoP (Device -> Device)"]}
    data = make_result(benchmark="transport_probe", platform="h200x2", backend="none", model="none", T=2, dtype="uint8",
                       samples=[{"rank": 0}], summary={"rows": [ok, {"transport": "ce", "op": "alltoall_kv_uneven",
                                                          "error": "RuntimeError: boom"}]})
    rows = [line for line in transport.render(Result("x.json", data), None) if line.startswith("| ce")]
    assert rows == ["| ce | allgather_kv | 1.00 | 0.80 | 10.0% | Memcpy PtoP |",
                    "| ce | alltoall_kv_uneven | - | - | - | RuntimeError: boom |"]


def test_copy_interference_rows_show_slowdowns_and_device_work():
    from splash_core.report import transport
    from splash_core.results import Result, ResultError

    row = {"variant": "memcpy", "mib_per_layer": 576.0, "step_alone_ms": 100.0, "step_ms": 103.0, "slowdown_ms": 3.0,
           "slowdown_pct": 3.0, "slowdown_ms_per_gib": 0.5, "copy_alone_ms": 0.5, "copies_per_layer": 16}
    sample = {"variant": "memcpy", "mib": 576.0, "run": 0, "step_ms": 103.0, "copy_alone_ms": 0.5,
              "bytes_per_layer": 1, "copies_per_layer": 16}
    kw = dict(benchmark="copy_interference", platform="h200", backend="hopper", model="deepseek-v3", T=1, dtype="bf16",
              samples=[sample])
    lengths = [{"run_pages": 4, "run_bytes": 4096, "copies": 10, "bytes": 40960, "device_ms": 0.5, "host_ms": 0.25},
               {"run_pages": 4, "run_bytes": 4096, "copies": 10, "bytes": 40960, "device_ms": 0.5, "host_ms": 0.25,
                "pitched": True}]
    data = make_result(summary={"workload": "w", "rows": [row]},
                       extra={"ran": {"memcpy": ["Memcpy DtoD (Device)"]}, "run_lengths": lengths}, **kw)
    lines = transport.render_copies(Result("x.json", data), None)
    assert [line for line in lines if line.startswith("| memcpy")] == [
        "| memcpy | 576 | 100.00 | 103.00 | 3.00 | 3.00% | 0.500 | 0.50 | Memcpy DtoD |"]
    assert "| consecutive | 4 | 4 | 10 | 0.50 | 0 | 0.25 |" in lines  # 40960 bytes in 0.5 ms
    assert "| pitched | 4 | 4 | 10 | 0.50 | 0 | 0.25 |" in lines
    with pytest.raises(ResultError, match="rows"):  # the same row twice
        make_result(summary={"workload": "w", "rows": [row, row]}, **kw)


def test_transport_probe_summary_takes_the_slowest_rank_and_says_what_failed():
    """bench/transport_probe.py's summary (its GPU part cannot run here): per transport and
    collective the slowest rank's medians; a collective one rank did not finish shows that
    rank's error; without two GPUs the script says so."""
    from bench_scripts import load_bench

    probe = load_bench("transport_probe")

    def rank(r, alone, with_mm, extra=None):
        ops = {"allgather_kv": {"alone_ms": [alone, alone], "kernels": ["k"], "repeat": 4,
                                "with_matmul_ms": [with_mm], "beside_matmul_ms": [4 * alone]}}
        ops.update(extra or {})
        return {"rank": r, "matmul_alone_ms": [10.0, 10.0 + r], "transports": {"sm": ops}}

    rows = probe._summary([rank(0, 1.0, 12.0, {"alltoall": {"error": "boom"}}), rank(1, 2.0, 11.0)])
    assert rows[0] == {"transport": "sm", "op": "allgather_kv", "alone_ms": 2.0, "kernels": ["k"], "repeat": 4,
                       "matmul_alone_ms": 10.5, "matmul_with_ms": 12.0, "matmul_slowdown_pct": 14.29,
                       "collectives_beside_ms": 8.0, "collective_slowdown_pct": 0.0}
    assert rows[1] == {"transport": "sm", "op": "alltoall", "error": "boom"}
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        with pytest.raises(SystemExit, match="needs 2 CUDA GPUs"):
            probe.main(["--out", "unused"])


def test_switch_overhead_parts_table_splits_splash_overhead_by_cause():
    from splash_core.report import switching
    from splash_core.results import Result

    summary, samples = examples()["switch_overhead"]
    parts = {"CP->DOP": {"before_first_ms_p50": 0.5, "first_wait_ms_p50": 2.0, "later_waits_ms_p50": 0.25,
                         "compute_ms_p50": 4.0, "runs": 3},
             "TP->CP": {"before_first_ms_p50": 0.75, "first_wait_ms_p50": 0.0, "later_waits_ms_p50": 1.0,
                        "compute_ms_p50": 0.5, "after_last_ms_p50": 0.25, "runs": 3}}  # a file of a deferred layer
    lines = switching.render(Result("x.json", {"summary": summary, "samples": samples, "splash_parts": parts}), None)
    overhead, split = tables("\n".join(lines))
    assert len(overhead) == 2
    assert split == [["TP → CP", "0.75", "0.00", "1.00", "0.50", "0.25", "2.50"],  # the paper's direction order
                     ["CP → DOP", "0.50", "2.00", "0.25", "4.00", "0.00", "6.75"]]  # older files: nothing after
    assert len(tables("\n".join(switching.render(Result("x.json", {"summary": summary, "samples": samples}), None)))) == 1


def test_sweep_predictions_stand_beside_the_papers_table(tmp_path):
    """A cost-model sweep (`splash sweep --paper --out`) renders position by position beside the
    paper's Table 6: predicted tokens/s with the error against the paper, both best layouts and
    the agreement per sweep and over the table."""
    label = "Input-length sweep, B = 16"
    rows = csv_rows("fixed_layout_sweeps.csv", "H200")
    rows = [r for r in rows if r["sweep"] == label][:3]
    # predicted: the paper's values scaled, TP made the best at the first position only
    points = []
    for i, r in enumerate(rows):
        for layout in ("TP", "CP", "DP", "DOP"):
            value = float(r[layout]) * 1000 * (1.1 if layout == "DP" else 1.0)
            if i == 0 and layout == "TP":
                value *= 2
            points.append({"sweep": label, "layout": layout, "batch": 16, "input_tokens": int(r["input_tokens"]),
                           "tokens_per_s": value})
    data = make_result(benchmark="fixed_layout_sweep", platform="h200x8", backend="cost model", model="deepseek-v3.2",
                       T=8, dtype="fp8 weights", samples=[], summary={"output_tokens": 1024, "points": points},
                       source="model", machine="modelled for 8x h200-paper", command="splash sweep --paper",
                       extra={"variant": "disaggregated"})
    write_result(data, tmp_path / "results", name="fixed_layout_sweep-model-disaggregated")
    from splash_core.report import render_report

    report = render_report(tmp_path / "results", tmp_path / "out", REFERENCE)
    text = section(chapter(report.markdown, "h200"), "Fixed-layout throughput sweeps")
    model = [b for b in blocks(text) if b.startswith("#### model")]
    assert len(model) == 1 and "(disaggregated)" in model[0].splitlines()[0]
    (predicted,) = tables(model[0])
    paper_best = [max(("TP", "CP", "DP", "DOP"), key=lambda l: float(r[l])) for r in rows]
    assert [row[-3:] for row in predicted] == [["TP", paper_best[0], "no" if paper_best[0] != "TP" else "yes"],
                                               ["DP", paper_best[1], "yes" if paper_best[1] == "DP" else "no"],
                                               ["DP", paper_best[2], "yes" if paper_best[2] == "DP" else "no"]]
    assert predicted[1][4] == f"{float(rows[1]['DP']) * 1100:,.0f} (+10%)"
    agree = sum(a == b for a, b in zip(["TP", "DP", "DP"], paper_best))
    assert f"{agree}/3 best layouts agree" in model[0]
    assert f"the best layout agrees at {agree}/3 positions" in model[0]
    # the picks scored by the paper's own throughputs: their time against the paper's best layout's
    paper = [{l: float(r[l]) * 1000 for l in ("TP", "CP", "DP", "DOP")} for r in rows]
    tokens = [16 * (int(r["input_tokens"]) + 1024) for r in rows]
    picks = sum(t / v[pick] for t, v, pick in zip(tokens, paper, ["TP", "DP", "DP"]))
    oracle = sum(t / max(v.values()) for t, v in zip(tokens, paper))
    assert f"their time is {picks / oracle:.3f}x the oracle's" in model[0]
    assert report.status["h200"]["fixed_layout_sweep"] == ["paper (T = 8)", "model (h200x8: T = 8, SPLASH's cost model)"]


def findings_of(md: str) -> str:
    return md.split("\n## Findings\n", 1)[1].split("\n## ", 1)[0]


def test_the_findings_come_first_name_their_sources_and_compute_their_ratios(rendered):
    """The summary at the top: what was measured and against what, then per headline one item per
    source, each saying measured here, taken from the paper or the cost model's; its ratios are
    computed from the results (here the examples' and the paper's CSV), never typed in."""
    md, _, _ = rendered
    assert md.index("## Findings") < md.index("## How to read this report") < md.index("## Overview")
    found = findings_of(md)
    scope = dict(re.findall(r"^- \*\*(Measured here|Against):\*\* (.*)$", found, re.M))
    assert scope["Measured here"].startswith("cpu (") and "; h200x2 (" in scope["Measured here"]
    assert "the paper's numbers for B200, H200, DCU (BW1000) (taken from the paper)" in scope["Against"]
    items = [line[4:] for line in found.splitlines() if line.startswith("  - ")]
    assert len(items) > 10
    assert all(item.startswith(("measured here (", "taken from the paper (", "cost model (")) for item in items)

    def median_share(directions) -> str:
        shares = sorted(float(d["splash_overhead_p50_ms"]) / float(d["ready_p50_ms"]) * 100 for d in directions)
        middle = len(shares) // 2
        return f"{(shares[middle] + shares[~middle]) / 2:.1f}%"

    paper = next(i for i in items if i.startswith("taken from the paper (B200, Table 1; T = 8): SPLASH's p50"))
    assert f"a median {median_share(csv_rows('switch_overheads.csv', 'B200'))} of the target-ready step" in paper
    ours = next(i for i in items if i.startswith("measured here (cpu: T = 2 on test machine): SPLASH's p50"))
    assert f"a median {median_share(examples()['switch_overhead'][0]['directions'])} of" in ours
    decode = examples()["mla_decode"][0]
    best = max(p["achieved_gbps"] for p in decode["points"]) / decode["copy_gbps"]
    assert f"measured here (cpu: T = 2 on test machine): decode reaches at best {best:.0%} of the copy " \
           "bandwidth measured in the same run (`torch`, B = 1, 8K)" in items


def test_not_measured_is_one_list_not_a_stub_per_section(rendered):
    md, _, _ = rendered
    assert md.count("not measured on this platform") <= 2 * len(CHAPTERS)  # the list and one line per chapter
    assert "**Measured:** not measured" not in md and "**Model:** no cost-model prediction" not in md
    for key in CHAPTERS:
        assert len(re.findall(r"^\*Not measured on this platform:\* ", chapter(md, key), re.M)) == 1


@pytest.fixture
def drawn(monkeypatch):
    """What every figure the report saves holds: per legend its entries, per panel its lines' labels."""
    from splash_core.report import figures

    seen, save = [], figures.save

    def keep(fig, path):
        legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        seen.append({"name": Path(path).name, "legends": [len(legend.get_texts()) for legend in legends],
                     "lines": [[line.get_label() for line in ax.get_lines()] for ax in fig.axes]})
        return save(fig, path)

    monkeypatch.setattr(figures, "save", keep)
    return seen


def test_a_t1_step_plot_draws_one_line_for_all_layouts(tmp_path, drawn):
    """At T = 1 the four layouts are the same computation: one line per batch, labelled so, not a
    line per layout on top of each other (which T = 2 keeps)."""
    from splash_core.report import steps
    from splash_core.report.context import Context
    from splash_core.results import Result

    for T in (1, 2):
        lines = steps.render(Result(f"t{T}.json", make("runtime_step", T=T)), Context(tmp_path, "cpu", []))
        assert ("one line per batch" in "\n".join(lines)) == (T == 1)
    one, two = drawn
    layouts = {p["layout"] for p in examples()["runtime_step"][0]["points"]}
    assert len(layouts) > 1
    assert all(panel == ["all layouts (T = 1)"] for panel in one["lines"]), one["lines"]
    assert max(len(panel) for panel in two["lines"]) == len(layouts)


def test_plots_keep_their_legends_small(tmp_path, drawn):
    """No legend passes figures.LEGEND_MAX entries, in any plot of the examples nor in a decode
    result of six kernels at four batch sizes (one line each would make 24 entries)."""
    from splash_core.report import figures, render_report

    results = tmp_path / "results"
    write_all(results, "cpu")
    kernels = [f"torch-gather+sdpa-efficient-attention-h{h}" for h in (16, 128)] + ["triton-splitkv-h16",
                                                                                    "triton-splitkv-h128", "a", "b"]
    points = [{"kernel": k, "batch": b, "context": c, "time_ms": 1.0, "achieved_gbps": 10.0 + b}
              for k in kernels for b in (1, 4, 16, 64) for c in (4096, 8192)]
    wide = make("mla_decode", platform="h200", summary={"copy_gbps": 100.0, "points": points},
                samples=[{k: p[k] for k in ("kernel", "batch", "context", "time_ms")} for p in points])
    write_result(wide, results)
    render_report(results, tmp_path / "out", headers_only_reference(tmp_path))
    assert figures.LEGEND_MAX <= 10 and len(drawn) > 5
    assert all(n <= figures.LEGEND_MAX for figure in drawn for n in figure["legends"]), drawn
    decode = next(f for f in drawn if f["name"] == "h200-measured-decode.png")
    assert len(decode["lines"]) == 4  # a panel per batch size
