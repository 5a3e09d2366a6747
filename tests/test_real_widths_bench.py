"""bench/real_widths.py (issue 21 §5) on CPU with small widths (--tiny), so its first H200 run
does not fail on a bug a CPU could have caught; and its sizing at DeepSeek-V3's real widths."""

from __future__ import annotations

from bench_scripts import load_bench

from splash_core import results

GIB = 1 << 30


def test_tiny_run_writes_valid_results(tmp_path):
    bench = load_bench("real_widths")
    args = bench.parse_args(["--tiny", "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")])
    assert bench.run(args) == 0
    data = results.read_result(tmp_path / "out" / "cpu" / "real_widths.json")
    s = data["summary"]
    assert s["layers"] == 3 and s["load"]["bytes_read"] > 0 and s["memory_bytes"]["experts"] > 0
    assert "FP8" in s["load"]["format"] and s["written"]["page_cache_dropped"]
    assert [r["context"] for r in s["runs"]] == args.contexts and not s["skipped"]
    for run in s["runs"]:
        assert run["decode_step_ms_p50"] > 0 and run["prefill_step_ms_p50"] > 0 and run["full_batch_decode_steps"] > 0
        # each step beside its roofline, the steps' contexts replayed as the engine ran them (issue 39)
        assert run["schedule_matches"] and run["decode_roofline_ms_p50"] > 0 and run["prefill_roofline_ms_p50"] > 0
    assert all(x["roofline_ms"] > 0 and x["over_roofline"] > 0 for x in data["samples"])
    assert s["rates"]["copy_gbps"] > 0 and s["rates"]["matmul_tflops"] > 0
    assert {x["phase"] for x in data["samples"]} == {"decode", "prefill"}
    assert not (tmp_path / "work").exists()  # the checkpoint is removed unless --keep


def test_sizing_at_real_widths_respects_device_and_disk():
    bench = load_bench("real_widths")
    args = bench.parse_args(["--workdir", "/tmp/splash-sizing-probe"])
    roomy, acc = bench.sizing(args, bench.V3, 1000 * GIB)  # the device decides
    assert acc["device_planned_bytes"] <= acc["device_budget_bytes"]
    assert acc["device_planned_bytes"] + acc["moe_layer_bytes"] + acc["kv_bytes_per_layer"] > acc["device_budget_bytes"]
    assert 4 <= roomy <= 10 and acc["moe_layer_bytes"] > 22e9  # 256 experts x 3 x 2048 x 7168 in bf16
    tight, acc = bench.sizing(args, bench.V3, 40 * GIB)  # the disk decides (FP8 files: half the bf16 bytes)
    assert tight < roomy and acc["disk_planned_bytes"] <= 36 * GIB
