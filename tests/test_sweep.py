"""The paper's fixed-layout protocol predicted by the cost model (`splash sweep`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from splash_core.cli.main import main
from splash_core.layouts import LAYOUTS, Layout
from splash_core.profiles import load
from splash_core.profiles.deployment import Disaggregation
from splash_core.studies import sweep_paper
from splash_core.studies.sweep import predict
from splash_core.studies.sweep_paper import PaperPosition, agreement, paper_positions

CPU = {"memory_gib": 16, "matmul_tflops": 0.0723, "weight_read_gbps": 6.5852, "kv_read_gbps": 1.2208,
       "all_gather_gbps": 0.5487, "all_to_all_gbps": 0.8666, "all_reduce_gbps": 0.8077,
       "collective_latency_us": 493.722, "step_overhead_us": 500}


def tiny(memory_gib: float = 16, **dis):
    """cpu-tiny with frozen θ (these tests do not move when cpu.yaml is recalibrated)."""
    data = {"name": "cpu-frozen", "platform": "cpu", "device": "test"}
    data.update({k: {"value": v, "source": "assumed", "ref": "test"} for k, v in dict(CPU, memory_gib=memory_gib).items()})
    dep = load("deployment", "cpu-tiny")
    return dataclasses.replace(dep, hardware=load("hardware", data),
                               disaggregation=Disaggregation(**{"prefill_chunk": 64, "decode_T": 2, **dis}))


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_throughput_is_the_papers_total_throughput(mode):
    dep = tiny()
    pp = predict(dep, 4, 200, 16, mode=mode)
    assert [p.layout for p in pp.layouts] == list(LAYOUTS)
    for p in pp.layouts:
        assert p.tokens_per_s == pytest.approx(4 * (200 + 16) / p.total_s)
        assert 0 < p.prefill_s <= p.total_s and p.most_resident == 4
    assert pp.best is max(pp.layouts, key=lambda p: p.tokens_per_s).layout


def test_decode_runs_on_the_fixed_group_so_layouts_differ_only_in_prefill():
    dep = tiny()
    short, long = predict(dep, 4, 16, 64), predict(dep, 4, 4096, 64)
    spread = lambda pp: max(p.total_s for p in pp.layouts) / min(p.total_s for p in pp.layouts)  # noqa: E731
    assert spread(short) < spread(long)  # decode (the same for every layout) dominates short prompts
    # every layout hands the same decode work over: its tail after the last prompt is alike
    tails = [p.total_s - p.prefill_s for p in long.layouts]
    assert max(tails) / min(tails) < 1.5


def test_a_small_prefill_pool_queues_prompts_and_a_prompt_it_cannot_hold_is_reported():
    budget = dataclasses.replace(tiny(), memory_fraction=1.0)
    kv = 3 * (32 * 4 + 8 * 4 + 16 * 4)  # tiny-mla's cache bytes per token over its 3 layers
    squeezed = dataclasses.replace(budget, hardware=dataclasses.replace(
        budget.hardware, memory_gib=dataclasses.replace(budget.hardware.memory_gib, value=5 * 2048 * kv / 2**30)))
    pp = predict(squeezed, 8, 2000, 8)
    tp, dop = pp.of(Layout.TP), pp.of(Layout.DOP)
    assert tp.most_resident < 8 and dop.most_resident == 8  # TP replicates every prompt's KV
    huge = predict(squeezed, 1, 40000, 8)
    assert huge.of(Layout.TP).tokens_per_s is None and "does not fit" in huge.of(Layout.TP).note


def test_the_decode_group_preallocates_before_prefill_starts_a_request():
    """SGLang's disaggregation: a request is prefilled only once the decode group has allocated
    its KV, and that allocation lasts until its last token; a full decode group stalls prefill."""
    kv = 3 * (32 * 4 + 8 * 4 + 16 * 4)  # tiny-mla's cache bytes per token over its 3 layers
    def deployment(decode_fraction):
        dep = dataclasses.replace(tiny(decode_memory_fraction=decode_fraction), memory_fraction=1.0, reserve_gib=0.0)
        memory = dataclasses.replace(dep.hardware.memory_gib, value=20 * 2048 * kv / 2**30)  # prefill holds 8+
        return dataclasses.replace(dep, hardware=dataclasses.replace(dep.hardware, memory_gib=memory))
    roomy, tight = predict(deployment(1.0), 8, 2000, 64), predict(deployment(0.07), 8, 2000, 64)
    for layout in LAYOUTS:
        assert roomy.of(layout).most_resident == 8
        assert tight.of(layout).most_resident == 2  # one request per decode rank: prefill waits for it
        assert tight.of(layout).total_s > roomy.of(layout).total_s


def test_cp_takes_one_prompt_per_step_unless_told_otherwise():
    one = predict(tiny(prefill_chunk=512), 8, 64, 4).of(Layout.CP)
    many = predict(tiny(prefill_chunk=512, cp_prompts_per_step=None), 8, 64, 4).of(Layout.CP)
    assert many.prefill_s < one.prefill_s  # fewer, fuller steps


def test_paper_positions_and_agreement(tmp_path):
    table6 = paper_positions("bench/reference", "h200", "DeepSeek-V3.2")
    assert len(table6) == 29 and {p.sweep for p in table6} >= {"Input-length sweep, B = 16"}
    first = table6[0]
    assert (first.batch, first.input_tokens, first.best) == (16, 1024, Layout.TP)
    assert first.tokens_per_s[Layout.CP] == pytest.approx(885.0)
    assert len(paper_positions("bench/reference", "b200", "glm-5.3")) == 32
    assert len(paper_positions("bench/reference", "dcu", "glm-5.3-flash")) == 34
    assert paper_positions("bench/reference", "cpu", "tiny-mla") == []
    with pytest.raises(FileNotFoundError, match="fixed_layout_sweeps.csv"):
        paper_positions(tmp_path, "h200", "DeepSeek-V3.2")
    paper = PaperPosition("s", 1, 1, {Layout.TP: 100.0, Layout.CP: 200.0, Layout.DP: 50.0, Layout.DOP: 10.0})
    a = agreement([(paper, {Layout.TP: 110.0, Layout.CP: 150.0, Layout.DP: 50.0, Layout.DOP: None}, Layout.CP),
                   (paper, {l: 100.0 for l in LAYOUTS}, Layout.TP)])
    assert (a.positions, a.agreeing) == (2, 1)
    assert sorted(round(e, 3) for e in a.errors)[:2] == [-0.5, -0.25]
    assert a.summary()["within_25_pct"] == pytest.approx(4 / 7)  # 0.1, 0.25 and the two zeros


def test_sweep_cli(tmp_path, capsys, monkeypatch):
    assert main(["sweep", "--deployment", "cpu-tiny", "--batch", "2", "--inputs", "64,256", "--output", "8",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["input_tokens"] for p in out["sweeps"][0]["positions"]] == [64, 256]
    assert "not a measurement" in out["note"] and out["mode"] == "disaggregated"
    png = tmp_path / "sweep.png"
    assert main(["sweep", "--deployment", "cpu-tiny", "--batches", "1,2", "--input", "128", "--output", "8",
                 "--mode", "colocated", "--plot", str(png), "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "Batch-size sweep, 128 input" in text and "best" in text
    assert png.stat().st_size > 5_000
    written = json.loads((tmp_path / "cpux2" / "fixed_layout_sweep-model-colocated.json").read_text())
    assert written["source"] == "model" and len(written["summary"]["points"]) == 8
    # --paper: the table's positions with the paper's values beside (two positions here, for speed)
    h200 = [PaperPosition("Input-length sweep, B = 2", 2, 64, {l: 100.0 for l in LAYOUTS}),
            PaperPosition("Input-length sweep, B = 2", 2, 128, {l: 200.0 for l in LAYOUTS})]
    monkeypatch.setattr("splash_core.cli.sweep.paper_positions", lambda *a: h200)
    assert main(["sweep", "--deployment", "cpu-tiny", "--paper", "--output", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["agreement"]["positions"] == 2 and out["sweeps"][0]["positions"][0]["paper"]["TP"] == 100.0
    for bad in (["--batch", "2"], ["--inputs", "1k"], ["--batch", "2", "--inputs", "1k", "--paper"],
                ["--batches", "0,2", "--input", "1k"], ["--batch", "2", "--inputs", "zero"]):
        assert main(["sweep", "--deployment", "cpu-tiny", *bad]) == 2
    monkeypatch.setattr("splash_core.cli.sweep.paper_positions", sweep_paper.paper_positions)
    assert main(["sweep", "--deployment", "cpu-tiny", "--paper"]) == 2
    assert "no fixed-layout sweep" in capsys.readouterr().err
