"""bench/real_widths.py with ``--ffn-weights fp8`` (issue 38): its sizing counts the feed-forward
weights at one byte (13 DeepSeek-V3 layers fit one H200 where 8 did, KV for 16 x 32K tokens
beside), and its tiny CPU run serves the FP8 checkpoint with the experts kept FP8 (about half
their bf16 bytes held) and writes real_widths-fp8."""

from __future__ import annotations

from bench_scripts import load_bench

from splash_core import results

GIB = 1 << 30


def test_sizing_counts_fp8_feed_forward_weights_at_one_byte():
    bench = load_bench("real_widths")
    sized = {ffn: bench.sizing(bench.parse_args(["--workdir", "/tmp/splash-sizing-probe", "--ffn-weights", ffn]),
                               bench.V3, 1000 * GIB) for ffn in ("compute", "fp8")}
    (bf16_layers, bf16), (fp8_layers, fp8) = sized["compute"], sized["fp8"]
    assert 0.5 < fp8["moe_layer_bytes"] / bf16["moe_layer_bytes"] < 0.52  # experts dominate a MoE layer
    assert fp8_layers >= 1.5 * bf16_layers and fp8["device_planned_bytes"] <= fp8["device_budget_bytes"]


def test_tiny_run_keeps_the_experts_fp8(tmp_path):
    bench = load_bench("real_widths")
    args = bench.parse_args(["--tiny", "--ffn-weights", "fp8", "--contexts", "48", "--out", str(tmp_path / "out"),
                             "--workdir", str(tmp_path / "work")])
    assert bench.run(args) == 0
    data = results.read_result(tmp_path / "out" / "cpu" / "real_widths-fp8.json")
    s, t = data["summary"], bench.TINY
    assert s["ffn_weights"] == "fp8" and "kept FP8" in data["notes"]
    moe_layers = s["layers"] - t["first_k_dense_replace"]
    bf16 = moe_layers * t["n_routed_experts"] * 3 * t["moe_intermediate_size"] * t["hidden_size"] * 2
    assert 0.5 * bf16 <= s["memory_bytes"]["experts"] <= 0.51 * bf16  # codes, plus a scale per 128 x 128 block
    assert [r["context"] for r in s["runs"]] == [48] and s["runs"][0]["decode_step_ms_p50"] > 0
