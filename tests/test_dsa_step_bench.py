"""bench/dsa_step.py's logic on the CPU reference with tiny shapes (--smoke), so its one GPU call
does not fail on a bug a CPU could have caught; and how it picks the sparse provider."""

from __future__ import annotations

import json

from bench_scripts import load_bench

from splash_core import results


def test_smoke_run_writes_valid_results(rank_pools, tmp_path):
    bench = load_bench("dsa_step")
    args = bench.parse_args(["--smoke", "--profile", "--out", str(tmp_path)])
    assert bench.run(args, rank_pools(1)) == 0
    got = results.read_result(tmp_path / "cpu" / "dsa_step.json")
    points = got["summary"]["points"]
    assert {(p["phase"], p["context"], p["provider"]) for p in points} == {
        (phase, c, provider) for phase in ("decode", "prefill") for c in (64, 160) for provider in ("dense", "reference")}
    assert all(p["finite"] and p["roofline_ms"] > 0 for p in points)
    sparse = [s for s in got["samples"] if s["sparse"] and s["context"] == 160]
    assert sparse and all(s["index_flops"] > 0 and s["kv_bytes"] > 0 for s in sparse)
    profiles = [s["profile"] for s in got["samples"]]  # --profile: each point's kernels by class, longest first
    assert profiles and all(p["span_us"] > 0 and p["top"] and p["top"][0]["us"] >= p["top"][-1]["us"] for p in profiles)


def test_smoke_run_with_fp8_feed_forward_weights_profiles_each_class_against_its_floor(rank_pools, tmp_path):
    """--ffn-weights fp8: the MLP kept FP8, its FLOPs counted apart (at the FP8 rate on a device that
    has one), fewer weight bytes than the same run in the compute dtype; the prefill chunk's LM head
    counted on each request's last row only; each profiled class beside its own floor."""
    bench = load_bench("dsa_step")
    got = {}
    for ffn in ("compute", "fp8"):
        args = bench.parse_args(["--smoke", "--profile", "--ffn-weights", ffn, "--name", f"dsa-{ffn}",
                                 "--out", str(tmp_path)])
        assert bench.run(args, rank_pools(1)) == 0
        got[ffn] = results.read_result(tmp_path / "cpu" / f"dsa-{ffn}.json")
    plain, kept = got["compute"], got["fp8"]
    assert kept["summary"]["ffn_weights"] == "fp8" and all(p["finite"] for p in kept["summary"]["points"])
    first = [r["samples"][0] for r in (plain, kept)]
    assert first[0]["fp8_flops"] == 0 < first[1]["fp8_flops"]
    assert 0 < first[1]["weight_bytes"] < first[0]["weight_bytes"]
    for s in kept["samples"]:
        costs, classes = s["class_costs"], s["profile"]["classes"]
        assert costs["gemm"]["fp8_flops"] == s["fp8_flops"] > 0 and classes["gemm"]["floor_us"] > 0
        assert classes["attention"]["floor_us"] > 0  # (on the CPU no operator is named as attention)
    head = [s["class_costs"]["lm_head"] for s in kept["samples"] if s["phase"] in ("decode", "prefill")]
    assert len({h["flops"] for h in head}) == 1  # B last rows in a decode step and a prefill chunk alike


def test_flashmla_is_chosen_only_where_it_wins_every_point_with_the_same_tokens(tmp_path):
    bench = load_bench("dsa_step")
    point = {"cache": "bf16", "phase": "decode", "context": 1}
    rows = [{**point, "provider": "triton", "ms": 2.0}, {**point, "provider": "flashmla", "ms": 1.0,
                                                         "tokens_match_triton": True},
            {**point, "phase": "prefill", "provider": "triton", "ms": 2.0},
            {**point, "phase": "prefill", "provider": "flashmla", "ms": 1.0, "tokens_match_triton": True}]
    assert bench.sparse_choice(rows)["bf16"]["provider"] == "flashmla"
    rows[3]["ms"] = 3.0
    assert bench.sparse_choice(rows)["bf16"]["provider"] == "triton"
    rows[3].update(ms=1.0, tokens_match_triton=False)
    assert bench.sparse_choice(rows)["bf16"]["provider"] == "triton"
    table = tmp_path / "providers.json"
    table.write_text(json.dumps({"decode": {"64": {"flashmla_from_kv_tokens": 1}}}))
    bench.write_providers(str(table), {"bf16": {"provider": "flashmla"}}, "cmd", "host")
    written = json.loads(table.read_text())
    assert written["decode"] == {"64": {"flashmla_from_kv_tokens": 1}} and written["sparse"]["bf16"]["provider"] == "flashmla"


def test_flashmla_is_chosen_per_phase_where_it_wins_every_point_of_that_phase():
    bench = load_bench("dsa_step")
    rows = [{"cache": "bf16", "phase": ph, "context": c, "provider": pr, "ms": ms, "tokens_match_triton": same}
            for ph, c, pr, ms, same in (("decode", 1, "triton", 1.0, None), ("decode", 1, "flashmla", 2.0, True),
                                        ("prefill", 1, "triton", 2.0, None), ("prefill", 1, "flashmla", 1.0, True),
                                        ("prefill", 2, "triton", 4.0, None), ("prefill", 2, "flashmla", 3.0, True))]
    choice = bench.sparse_choice(rows)["bf16"]
    assert choice["provider"] == "triton" and choice["phases"] == {"decode": "triton", "prefill": "flashmla"}
    rows[-1]["tokens_match_triton"] = False  # a point with other tokens: that phase keeps Triton
    assert bench.sparse_choice(rows)["bf16"]["phases"]["prefill"] == "triton"
