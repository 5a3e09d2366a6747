"""bench/serve_bench.py (issue 25 §4) on CPU with small widths (--tiny): the real-widths checkpoint
path, splash serve at T = 1 and sglang.bench_serving per rate, so its H200 run does not fail on a
bug a CPU could have caught."""

from __future__ import annotations

from bench_scripts import load_bench

from splash_core import results
from splash_core.cli.main import main


def test_tiny_run_writes_every_rate_and_a_clean_exit(tmp_path):  # requests sample: the server's sampled path
    bench = load_bench("serve_bench")
    args = bench.parse_args(["--tiny", "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work"),
                             "--rates", "8", "inf", "--num-prompts", "12", "--input-len", "256", "--output-len", "12",
                             "--temperature", "1.0", "--top-p", "0.9", "--name", "served_bench-sampled"])
    assert bench.run(args) == 0
    data = results.read_result(tmp_path / "out" / "cpu" / "served_bench-sampled.json")
    s = data["summary"]
    assert [r["rate"] for r in s["runs"]] == ["8", "inf"] and not s["skipped"] and s["server_exit_code"] == 0
    for run in s["runs"]:
        b = run["bench_serving"]
        assert run["completed"] == b["completed"] == 12 and b["median_ttft_ms"] > 0 and b["median_itl_ms"] > 0
        assert "splash_requests_total" in run["metrics"] and run["server_info"]["T"] == 1
    assert len(data["samples"]) == 24 and {x["output_tokens"] for x in data["samples"]} == {12}
    assert all(32 <= x["input_tokens"] <= 256 for x in data["samples"])  # 256 x 0.125 at least
    # bench_serving times a gap per token after the first chunk with text; a sampled special token at the
    # start carries none (its time goes to TTFT), so a few requests may time one gap fewer, never more
    gaps = [x["output_tokens"] - 1 - len(x["itl_ms"]) for x in data["samples"]]
    assert min(gaps) >= 0 and sum(g == 0 for g in gaps) >= len(gaps) - 4, gaps
    assert not (tmp_path / "work").exists()
    assert main(["report", "--results", str(tmp_path / "out"), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "README.md").read_text()
    assert "Served: SGLang's benchmark client against splash serve" in report and "| inf " in report
    assert "12 output tokens each, sampled at temperature 1, top_p 0.9." in report
