"""The physical limit of a ``splash run`` (bench/prefill_forms.py, issue 39 §3): the replayed
schedule has the engine's rows and requests at every step (chunked prefill, decode rows beside
it), the limit's parts add up, a planted difference in the schedule is named, and a limit of no
steps, of rates that are not positive or of a run time that is not is refused. The smoke run
writes the limit with FP8 feed-forward weights on seeded widths."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from splash_bench.run_roofline import ModelCosts, Step, physical_limit, schedule, schedule_difference
from splash_core.profiles import load
from splash_core.results import read_result

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "prefill_forms.py"
RATES = {"copy_gbps": 100.0, "matmul_tflops": 1.0}


def test_schedule_replays_chunked_prefill_then_decode():
    steps = schedule([(5, 2), (3, 3)], prefill_chunk=4)
    # step 0: request 0 takes 4 rows; step 1: its last row (first token) and 3 of request 1 (first token);
    # then request 0 decodes its second token beside request 1's, and request 1 its third alone
    assert steps == [Step((4,), (4,)), Step((1, 3), (5, 3)), Step((1, 1), (6, 4)), Step((1,), (5,))]
    assert [s.decode for s in steps] == [False, False, True, True]
    assert schedule_difference(steps, [4, 4, 2, 1], [1, 2, 2, 1]) == ""
    assert schedule_difference(steps, [4, 4, 2, 2], [1, 2, 2, 1]) == "step 3: replayed 1 rows of 1 requests, ran 2 of 1"
    assert schedule_difference(steps, [4, 4, 2], [1, 2, 2]) == "4 steps replayed, 3 ran"


def test_limit_parts_add_up_and_bad_input_is_refused():
    profile = load("model", "tiny-mla")
    costs = ModelCosts.of(profile, 2, 4, 4, ffn_fp8=False)
    kept = ModelCosts.of(profile, 2, 4, 4, ffn_fp8=True)
    assert kept.weight_bytes < 0.8 * costs.weight_bytes and kept.row_flops == costs.row_flops
    steps = schedule([(40, 3), (20, 2)], prefill_chunk=32)
    got = physical_limit(costs, steps, "auto", RATES, [1.0] * len(steps), 0.05)
    parts = got["parts"]
    assert parts["prefill"]["steps"] + parts["decode"]["steps"] == len(steps)
    assert got["physical_limit_s"] == pytest.approx(parts["prefill"]["limit_s"] + parts["decode"]["limit_s"])
    assert got["ratio"] == pytest.approx(got["physical_limit_s"] / 0.05) and parts["decode"]["bytes"] > 0
    assert parts["prefill"]["limit_s"] == pytest.approx(parts["prefill"]["flops"] / 1e12)
    assert parts["prefill"]["device_s"] is None and parts["decode"]["device_ratio"] is None  # none measured
    timed = physical_limit(costs, steps, "auto", RATES, [1.0] * len(steps), 0.05, [2.0] * len(steps))["parts"]
    for name, part in timed.items():
        assert part["device_s"] == pytest.approx(2e-3 * part["steps"])
        assert part["measured_s"] == parts[name]["measured_s"]
        assert part["device_ratio"] == pytest.approx(part["limit_s"] / part["device_s"])
    partial = physical_limit(costs, steps, "auto", RATES, [1.0] * len(steps), 0.05, [2.0] + [None] * (len(steps) - 1))
    assert partial["parts"]["decode"]["device_s"] is None  # a step without device time: no device split at all
    # a run admitted in waves: its own steps (not the replay's) split the measured time; here its
    # first step decoded and the rest prefilled, a long host stall booked to that decode step
    ran = [True] + [False] * (len(steps) - 1)
    waves = physical_limit(costs, steps, "auto", RATES, [9.0] + [1.0] * (len(steps) - 1), 0.05,
                           [1.0] + [3.0] * (len(steps) - 1), ran)["parts"]
    assert waves["decode"]["measured_s"] == pytest.approx(9e-3) and waves["decode"]["device_s"] == pytest.approx(1e-3)
    assert waves["prefill"]["device_s"] == pytest.approx(3e-3 * (len(steps) - 1))
    assert waves["decode"]["limit_s"] == parts["decode"]["limit_s"]  # the floors stay the replayed schedule's
    absorbed = physical_limit(costs, steps, "absorbed", RATES, [1.0] * len(steps), 0.05)
    assert absorbed["parts"]["prefill"]["flops"] > parts["prefill"]["flops"]  # fresh prompts: expanded is cheaper
    for bad in (([], RATES, 1.0), (steps, {**RATES, "copy_gbps": 0.0}, 1.0),
                (steps, {**RATES, "fp8_matmul_tflops": 0.0}, 1.0), (steps, {**RATES, "matmul_tflops": math.nan}, 1.0),
                (steps, RATES, math.nan), (steps, RATES, 0.0)):
        with pytest.raises(ValueError, match="no physical limit"):
            physical_limit(costs, bad[0], "auto", bad[1], [], bad[2])


def test_smoke_run_writes_its_limit_with_fp8_feed_forward_weights(tmp_path):
    spec = importlib.util.spec_from_file_location("prefill_forms", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--smoke", "--out", str(tmp_path), "--forms", "auto", "--prefill-chunk", "50",
                        "--ffn-weights", "fp8"]) == 0
    result = read_result(tmp_path / "cpu" / "prefill_forms-fp8.json")
    (s,) = result["samples"]
    assert s["schedule_matches"] and s["schedule_difference"] == "" and s["prefill_steps"] > 1
    assert 0 < s["physical_limit_s"] < s["measured_s"] and s["ratio"] == pytest.approx(s["physical_limit_s"] /
                                                                                         s["measured_s"])
    assert s["parts"]["decode"]["bytes"] > 0 and s["parts"]["prefill"]["flops"] > 0
    assert len(s["step_device_ms"]) == s["steps"] and all(ms >= 0 for ms in s["step_device_ms"])
    assert s["parts"]["prefill"]["device_s"] > 0 and s["parts"]["decode"]["device_s"] > 0
    assert result["summary"]["ffn_weights"] == "fp8" and result["summary"]["rates"]["copy_gbps"] > 0


def test_gemms_against_fp8_weights_are_held_to_the_fp8_rate():
    """Where the run measured an FP8 matmul rate, the FLOPs through weights kept FP8 take that rate
    (the bf16 one would flatter an FP8 run); without one, every FLOP takes the matmul rate."""
    profile = load("model", "tiny-mla")
    plain, kept = (ModelCosts.of(profile, 2, 4, 4, ffn_fp8=f) for f in (False, True))
    assert plain.fp8_row_flops == 0 and 0 < kept.fp8_row_flops < kept.row_flops
    steps = schedule([(40, 3), (20, 2)], prefill_chunk=32)
    held = physical_limit(kept, steps, "auto", RATES, [1.0] * len(steps), 0.05)["parts"]["prefill"]
    fast = physical_limit(kept, steps, "auto", {**RATES, "fp8_matmul_tflops": 2.0}, [1.0] * len(steps),
                          0.05)["parts"]["prefill"]
    assert held["limit_s"] == pytest.approx(held["flops"] / 1e12) and held["fp8_flops"] > 0
    assert fast["limit_s"] == pytest.approx((fast["flops"] - fast["fp8_flops"]) / 1e12 + fast["fp8_flops"] / 2e12)
    unkept = physical_limit(plain, steps, "auto", {**RATES, "fp8_matmul_tflops": 2.0}, [1.0] * len(steps), 0.05)
    assert unkept["parts"]["prefill"]["fp8_flops"] == 0 and unkept["parts"]["prefill"]["limit_s"] == pytest.approx(
        unkept["parts"]["prefill"]["flops"] / 1e12)
