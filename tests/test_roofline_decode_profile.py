"""``bench/decode_step.py --smoke --profile`` on the CPU reference (issue 39): every point's replay
is profiled (the host's outermost operators standing in for device kernels) and its split written with the
keys the GPU run writes: each class's time and share, its bytes, FLOPs and floor from the step's
roofline, the idle gap and the time outside the kernels' span."""

from __future__ import annotations

from bench_scripts import load_bench

from splash_bench.kernel_classes import NAMES
from splash_core import results


def test_smoke_profile_writes_the_split_of_every_point(rank_pools, tmp_path):
    bench = load_bench("decode_step")
    args = bench.parse_args(["--smoke", "--profile", "--profile-reps", "2", "--no-unfused", "--out", str(tmp_path)])
    assert bench.run(args, rank_pools(1)) == 0
    points = results.read_result(tmp_path / "cpu" / "decode_step.json")["summary"]["points"]
    assert len(points) == 4
    for p in points:
        prof = p["profile"]
        assert set(prof["classes"]) == set(NAMES) and len(prof["spans_us"]) == 2 and not prof["device"]
        assert prof["profiled"] == "graph"  # the replay's own operators (on the CPU, its static step's)
        c = prof["classes"]
        assert c["lm_head"]["kernels"] == 1 and c["gemm"]["kernels"] > 0 and c["gemm"]["us"] > 0
        for cls in ("attention", "gemm", "lm_head"):  # the roofline's parts, each beside its class's time
            assert c[cls]["bytes"] > 0 and c[cls]["flops"] > 0 and c[cls]["floor_us"] > 0
        assert 0 <= prof["idle_gap_us"] < prof["span_us"] and prof["busy_us"] > 0
        assert abs(sum(v["share"] for v in c.values()) + prof["idle_share"] - 1) < 1e-6
        assert prof["replay_event_us"] > 0


def test_a_replay_whose_kernels_are_not_recorded_falls_back_to_the_eager_step():
    """Where the profiler records none of a graph's kernels, the eager step's kernels are split
    instead (marked so); where neither gives kernels, the error is kept and the timings stand."""
    import torch

    from splash_bench.replay_profile import profile_step

    class Ctx:  # a rank on the CPU
        device = torch.device("cpu")

        class streams:  # noqa: N801 - what ctx.streams offers here
            @staticmethod
            def synchronize():
                pass

    a = torch.randn(64, 64)
    rates = {"copy_gbps": 10.0, "matmul_tflops": 0.1}
    got = profile_step(Ctx(), lambda: None, lambda: a @ a, 2, 1.0, {"gemm": {"bytes": 1, "flops": 1}}, rates)
    assert got["profiled"] == "eager" and "no kernels" in got["graph_error"]
    assert got["classes"]["lm_head"]["kernels"] == 1  # the one GEMM is the step's last
    assert profile_step(Ctx(), lambda: None, lambda: None, 2, 1.0, {}, rates) == {
        "error": "ValueError: no kernels in the profiled step (was the profiler's device activity on?)"}
    replayed = profile_step(Ctx(), lambda: a @ a, lambda: None, 2, 1.0, {}, rates)
    assert replayed["profiled"] == "graph" and "graph_error" not in replayed
