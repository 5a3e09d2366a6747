"""bench/switch_trace.py: the trace summary (:func:`device_trace.timeline`) on a hand-made
trace whose answer is known, and the script's logic on CPU (--smoke)."""

from __future__ import annotations

import time

import pytest
from bench_scripts import load_bench

from splash_bench.device_trace import category, timeline
from splash_core import results

COMPUTE, SIDE = 7, 21


def _kernel(name, stream, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream, "correlation": corr}}


def _launch(ts, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "args": {"correlation": corr}}


def test_timeline_splits_idle_time_and_contention():
    events = [
        _kernel("_attention_kernel", COMPUTE, 0, 100, 1), _launch(-5, 1),
        # a 20 us gap whose next kernel was launched before it began: a wait on an event
        _kernel("_attention_kernel", COMPUTE, 120, 100, 2), _launch(50, 2),
        # a 30 us gap whose next kernel was launched 10 us into it: the host was late
        _kernel("sm90_xmma_gemm_bf16", COMPUTE, 250, 50, 3), _launch(230, 3),
        # contended: a collective on the side stream covers the third attention kernel entirely
        _kernel("_attention_kernel", COMPUTE, 300, 160, 4), _launch(100, 4),
        _kernel("ncclDevKernel_AllGather_RING_LL", SIDE, 290, 200, 5), _launch(100, 5),
        _kernel("_copy_pages", SIDE, 500, 10, 6), _launch(100, 6),
    ]
    t = timeline({"traceEvents": events})
    assert t["compute_stream"] == COMPUTE
    assert t["compute_span_us"] == 460 and t["compute_busy_us"] == 410
    assert t["wait_idle_us"] == 20 and t["host_idle_us"] == 30
    assert t["streams"][str(SIDE)] == {"collective": 200, "pages": 10}
    assert t["streams"][str(COMPUTE)] == {"attention": 360, "matmul": 50}
    attention = t["slowdown"]["attention"]
    assert attention["contended_kernels"] == 1 and attention["median_alone_us"] == 100
    assert attention["extra_us"] == pytest.approx(60)
    assert t["contended_us"] == 160


def test_timeline_without_device_kernels_is_empty():
    assert timeline({"traceEvents": [_launch(0, 1)]}) == {}
    assert category("void at::native::elementwise_kernel") == "other"


def test_smoke_run_writes_a_row_per_direction_and_mode(rank_pools, tmp_path):
    script = load_bench("switch_trace")
    args = script.parse_args(["--smoke", "--out", str(tmp_path), "--directions", "TP-CP,DP-DOP"])
    rows = rank_pools(2).run(script.device_trace.trace_switches, script.spec_of(args))[0]
    assert [(r["src"], r["dst"], r["mode"]) for r in rows] == [
        ("TP", "CP", "ready"), ("TP", "CP", "splash"), ("DP", "DOP", "ready"), ("DP", "DOP", "splash")]
    assert all(r["step_ms"] > 0 for r in rows)
    assert rows[1]["exposed_ms"] > 0 and rows[0]["exposed_ms"] == 0  # only SPLASH waits on transfers
    for row in rows:  # the probed untraced steps: every layer of the smoke model, host always drained
        assert len(row["layers"]["compute_ms"]) == 2 and row["layers"]["drained"] == [3, 3]
    assert rows[1]["layers"]["totals"]["wait_ms"] > rows[0]["layers"]["totals"]["wait_ms"]
    assert script.main(["--smoke", "--out", str(tmp_path), "--directions", "CP-TP", "--variants",
                        "base,nodefer,nodefer+pulls", "--transfer", "min_run_bytes=0"]) == 0
    data = results.read_result(tmp_path / "cpu" / "switch_trace.json")
    assert [(s["variant"], s["mode"]) for s in data["samples"]] == [
        (v, m) for v in ("base", "nodefer", "nodefer+pulls") for m in ("ready", "splash")]
    base, nodefer, pulled = data["samples"][1::2]
    # layer 0 computed the step in its source layout (CP), the rest as ready: equal up to reduction order
    assert base["deferred_layer"] == 0 and base["max_abs_diff_vs_ready"] < 1e-4
    for row, pulls in ((nodefer, False), (pulled, True)):  # the moved state computes what the ready one does
        assert row["deferred_layer"] is None and row["max_abs_diff_vs_ready"] == 0 and row["pulls"] is pulls


def test_report_renders_a_row_per_variant_and_direction(rank_pools, tmp_path):
    from splash_core.report import switch_trace as section

    script = load_bench("switch_trace")
    assert script.main(["--smoke", "--out", str(tmp_path), "--directions", "TP-CP,CP-DOP", "--variants",
                        "base,noalign", "--timed-runs", "1"]) == 0
    lines = section.render(results.read_result(tmp_path / "cpu" / "switch_trace.json"), None)
    rows = [line for line in lines if line.startswith("| base") or line.startswith("| noalign")]
    assert [r.split("|")[1:3] for r in rows] == [
        [" base ", " TP→CP "], [" base ", " CP→DOP "], [" noalign ", " TP→CP "], [" noalign ", " CP→DOP "]]
    assert all("layer 0 moved after the step" in r and "logits" in r for r in rows)
    assert all(r.split("|")[8].strip() not in ("", "-") for r in rows)  # the untraced layers were timed


def test_layer_probe_times_each_boundary_the_executor_shows_it():
    from splash_bench.layer_probe import LayerProbe, summarize
    from splash_core.reference.streams import HostStreamOps

    probe = LayerProbe(HostStreamOps())

    def step(hook_s: float) -> None:  # as a switch executor calls its tracer
        for i in range(3):
            with probe.layer(i):
                time.sleep(hook_s)  # the executor's work at the boundary (landing the layer's state)
            time.sleep(0.002 * (i + 1))  # layer i computes 2 (i + 1) ms
        probe.step_end()

    step(0.003)
    step(0.0)  # a ready step: nothing at the boundaries
    hooked, plain = (summarize([s]) for s in probe.take())
    assert probe.steps == []
    assert all(w >= 3 for w in hooked["wait_ms"]) and sum(plain["wait_ms"]) < sum(hooked["wait_ms"])
    for layers in (hooked, plain):
        assert all(c >= 2 * (i + 1) for i, c in enumerate(layers["compute_ms"]))  # sleep never undershoots
        assert layers["totals"]["span_ms"] >= layers["totals"]["compute_ms"] and layers["drained"] == [1, 1, 1]
    probe.active = False
    step(0.0)
    assert probe.take() == []
