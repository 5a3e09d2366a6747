"""``splash calibrate``: the generic θ measurement on gloo ranks, the collective fit, the
runtime host overheads (timed decode steps and their fit), and the hardware profile it writes
(measured entries carry date, machine and command)."""

from __future__ import annotations

import pytest
import torch
import yaml

from splash_core.cli.main import main
from splash_core.layouts import LAYOUTS, Layout
from splash_core.planning import host_overhead
from splash_core.profiles import loader
from splash_core.studies import calibrate, calibrate_runtime

KEYS = ("matmul_tflops", "weight_read_gbps", "kv_read_gbps", "all_gather_gbps", "all_to_all_gbps",
        "all_reduce_gbps", "collective_latency_us")


def test_fit_recovers_latency_and_bandwidth():
    samples = [{"op": op, "ranks": 2, "bytes": b, "seconds": 20e-6 + b / (bw * 1e9)}
               for op, bw in (("all_gather", 200.0), ("all_to_all", 50.0), ("all_reduce", 100.0))
               for b in (4096, 1 << 20, 1 << 24)]
    theta = calibrate.fit_collectives(samples)
    assert theta["all_gather_gbps"] == pytest.approx(200.0)
    assert theta["all_to_all_gbps"] == pytest.approx(50.0)
    assert theta["all_reduce_gbps"] == pytest.approx(100.0)
    # the smallest messages' time: latency plus their own (tiny) transfer
    assert 20.0 < theta["collective_latency_us"] < 20.1


def test_measure_on_two_gloo_ranks(rank_pools):
    results = rank_pools(2).run(calibrate.calibrate_rank, {"quick": True, "dtype": torch.float32})
    theta = results[0]
    for key in KEYS:
        assert theta[key] > 0, key
    assert {s["op"] for s in theta["collective_samples"]} == set(calibrate.COLLECTIVE_OPS)
    assert all(s["ranks"] == 2 and s["seconds"] > 0 for s in theta["collective_samples"])
    # collective numbers are agreed across the group (slowest rank's time)
    assert results[1]["collective_samples"] == theta["collective_samples"]

    base = loader.load("hardware", "cpu")
    data = calibrate.build_profile(theta, base, name="cpu-test", machine="test host", command="splash calibrate ...",
                                   backend="reference", date="2026-01-02")
    profile = loader.from_mapping("hardware", data, file="<test>")
    for key in KEYS:
        q = getattr(profile, key)
        assert (q.source, q.date, q.machine) == ("measured", "2026-01-02", "test host"), key
        assert q.ref  # says what was measured
    assert profile.memory_gib == base.memory_gib and profile.step_overhead_us == base.step_overhead_us
    assert "memory_gib" in profile.notes and len(profile.collective_samples) == len(theta["collective_samples"])


def test_without_a_base_profile_unmeasured_memory_is_an_error():
    theta = {key: 1.0 for key in KEYS}
    with pytest.raises(ValueError, match="measured no memory_gib .* pass --base"):
        calibrate.build_profile(theta, None, name="x", machine="m", command="c", backend="cuda")
    data = calibrate.build_profile({**theta, "memory_gib": 80.0}, None, name="x", machine="m", command="c",
                                   backend="cuda")
    profile = loader.from_mapping("hardware", data, file="<test>")
    assert profile.step_overhead_us.source == "assumed" and profile.platform == "cuda"


def test_cli_writes_a_profile_that_loads(tmp_path, capsys):
    out = tmp_path / "host.yaml"
    out.write_text("an earlier profile\n")  # replaced only because of --force
    assert main(["calibrate", "--backend", "reference", "--ranks", "1", "--quick", "--out", str(out), "--force"]) == 0
    profile = loader.load("hardware", str(out))
    assert profile.name == "host" and profile.matmul_tflops.source == "measured"
    assert "--backend reference --ranks 1" in profile.matmul_tflops.command
    assert "--model tiny-mla --layers 3" in profile.step_overhead_us.command  # the runtime was timed
    assert set(profile.layer_overhead_us) == set(LAYOUTS) and profile.host_overlap.source == "measured"
    assert profile.all_gather_gbps == loader.load("hardware", "cpu").all_gather_gbps  # one rank: kept from base
    assert "wrote" in capsys.readouterr().out
    assert yaml.safe_load(out.read_text())["kind"] == "hardware"


def test_cli_rejects_bad_input(tmp_path, capsys):
    assert main(["calibrate", "--backend", "reference", "--ranks", "0", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "argument --ranks: must be >= 1 (got 0)" in capsys.readouterr().err
    assert main(["calibrate", "--backend", "nosuch", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "no backend named 'nosuch'" in capsys.readouterr().err
    assert main(["calibrate", "--backend", "reference", "--base", "nosuch", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "no hardware profile named 'nosuch'" in capsys.readouterr().err
    for bad, message in ((["--layers", "9"], "--layers must be in 1..3 for model 'tiny-mla' (got 9)"),
                         (["--layers", "0"], "argument --layers: must be >= 1 (got 0)"),
                         (["--no-runtime", "--model", "tiny-mla"], "drop --no-runtime"),
                         (["--no-runtime", "--graphs", "off"], "drop --no-runtime"),
                         (["--graphs", "on"], "--graphs on: backend reference runs on the host, which captures no graphs"),
                         (["--model", "glm-5.3-flash", "--layers", "8"], "mix layer kinds (kda, mla)")):
        assert main(["calibrate", "--backend", "reference", *bad, "--out", str(tmp_path / "x.yaml")]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err
    assert not (tmp_path / "x.yaml").exists()


def test_shipped_cpu_profile_is_measured():
    profile = loader.load("hardware", "cpu")
    for key in KEYS:
        assert getattr(profile, key).source == "measured", key
    assert profile.collective_samples
    host = [profile.step_overhead_us, profile.host_overlap, *profile.layer_overhead_us.values()]
    assert len(host) == 6 and all(q.source == "measured" for q in host)
    assert {s.layers for s in profile.step_samples} == {0, 3}


# ---- the runtime's host overheads ------------------------------------------------------

def synthetic_points(host_us: dict, eta: float, device_us=(20.0, 300.0, 900.0)):
    """Per-layer points of a runtime that follows the cost model's host term exactly."""
    return [host_overhead.LayerPoint(l, i, (d + max(0.0, host_us[l] - eta * d)) * 1e-6, d * 1e-6)
            for l in LAYOUTS for i, d in enumerate(device_us)]


@pytest.mark.parametrize("eta", [0.0, 0.37, 1.0])
def test_host_fit_recovers_overheads_and_overlap(eta):
    host = {Layout.TP: 700.0, Layout.CP: 1500.0, Layout.DP: 400.0, Layout.DOP: 1000.0}
    points = synthetic_points(host, eta)  # at η_h = 1 the 900 µs points of DP are device-bound
    fit = host_overhead.fit_host_overheads(points)
    assert fit.host_overlap == pytest.approx(eta) and not fit.notes
    for layout in LAYOUTS:
        assert fit.layer_s[layout] * 1e6 == pytest.approx(host[layout])
    assert host_overhead.rms_residual(points, fit) < 1e-12
    # given η_h, one context per layout is enough
    single = [p for p in points if p.context == 0]
    given = host_overhead.fit_host_overheads(single, host_overlap=eta)
    assert given.layer_s[Layout.CP] * 1e6 == pytest.approx(1500.0)


def test_host_fit_says_what_it_cannot_know():
    host = {l: 100.0 for l in LAYOUTS}
    device_bound = synthetic_points(host, 1.0, device_us=(300.0, 900.0))
    fit = host_overhead.fit_host_overheads(device_bound)
    assert any("not identifiable" in n for n in fit.notes)
    over = [host_overhead.LayerPoint(l, 0, 50e-6, 80e-6) for l in LAYOUTS]  # faster than Eq 10 predicts
    fit = host_overhead.fit_host_overheads(over, host_overlap=0.0)
    assert all(h == 0.0 for h in fit.layer_s.values()) and "over-predicts" in fit.notes[0]
    with pytest.raises(ValueError, match="two contexts"):
        host_overhead.fit_host_overheads(over)
    with pytest.raises(ValueError, match="layout DOP"):
        host_overhead.fit_host_overheads([p for p in over if p.layout is not Layout.DOP], host_overlap=0.0)


def test_runtime_timing_on_two_gloo_ranks(rank_pools):
    spec = calibrate_runtime.RuntimeSpec.choose(accelerator=False, quick=True)
    per_rank = rank_pools(2).run(calibrate_runtime.time_steps, spec, "fp32")
    samples = per_rank[0]
    assert per_rank[1] == samples  # agreed: the slowest rank's times
    # the host replays nothing: decode and prefill ran eagerly, nothing at a second layer count
    assert sorted((s["layers"], s["layout"], s["context"], s["phase"]) for s in samples) == sorted(
        [(0, "TP", c, "decode") for c in spec.contexts]
        + [(3, str(l), c, ph) for l in LAYOUTS for c in spec.contexts for ph in ("decode", "prefill")])
    assert all(s["seconds"] > 0 and s["batch"] == spec.batch and s["path"] == "eager" for s in samples)
    assert {s["rows"] for s in samples if s["phase"] == "prefill"} == {spec.prefill_chunk}

    base = loader.load("hardware", "cpu").without_host_overheads()
    host = calibrate_runtime.fit_theta(samples, base, spec, 2, "fp32")
    assert host["step_overhead_us"] > 0 and 0 <= host["host_overlap"] <= 1
    assert set(host["layer_overhead_us"]) == {str(l) for l in LAYOUTS}
    assert "graph_layer_overhead_us" not in host  # nothing replayed
    theta = {"matmul_tflops": 1.0, **host}
    data = calibrate.build_profile(theta, base, name="t", machine="test host", command="splash calibrate ...",
                                   backend="reference", date="2026-01-02")
    profile = loader.from_mapping("hardware", data, file="<test>")
    for q in (profile.step_overhead_us, profile.host_overlap, *profile.layer_overhead_us.values()):
        assert (q.source, q.date, q.machine) == ("measured", "2026-01-02", "test host")
    assert "rms residual" in profile.layer_overhead_us[Layout.CP].ref
    assert len(profile.step_samples) == len(samples)
    # a later calibration without the runtime keeps the host term and the steps it was fitted to
    again = calibrate.build_profile({"matmul_tflops": 2.0}, profile, name="t", machine="m", command="c",
                                    backend="reference")
    kept = loader.from_mapping("hardware", again, file="<test>")
    assert kept.layer_overhead_us == profile.layer_overhead_us and kept.step_samples == profile.step_samples
    assert "layer_overhead_us" in kept.notes


# ---- decode steps replayed from captured graphs ---------------------------------------------

def test_replayed_fit_recovers_t0_and_time_per_layer():
    t0, gap = 400e-6, {Layout.TP: 20e-6, Layout.CP: 35e-6, Layout.DP: 0.0, Layout.DOP: 50e-6}
    points = [host_overhead.ReplayPoint(l, n, t0 + n * gap[l]) for l in LAYOUTS for n in (1, 4)]
    fit = host_overhead.fit_replayed(points)
    assert fit.step_s == pytest.approx(t0) and not fit.notes
    assert all(fit.layer_s[l] == pytest.approx(gap[l], abs=1e-12) for l in LAYOUTS)
    with pytest.raises(ValueError, match="two layer counts"):
        host_overhead.fit_replayed([p for p in points if p.layers == 4])
    with pytest.raises(ValueError, match="layout DP"):
        host_overhead.fit_replayed([p for p in points if p.layout is not Layout.DP])
    faster = [host_overhead.ReplayPoint(l, n, -1e-6 * n) for l in LAYOUTS for n in (1, 4)]  # below Eq 10
    fit = host_overhead.fit_replayed(faster)
    assert all(g == 0.0 for g in fit.layer_s.values()) and any("over-predicts" in n for n in fit.notes)


def _with_graph_terms(profile, graph_us: float, t0_us: float):
    host = {l: 1000.0 for l in LAYOUTS}
    return profile.with_host_overheads(host, 1.0, {l: graph_us for l in LAYOUTS}, t0_us, source="measured",
                                       ref="test", date="2026-01-02", machine="m", command="c")


def test_cost_model_charges_replayed_decode_steps_their_own_terms():
    from splash_core.planning.costmodel import CostModel

    model = loader.load("model", "deepseek-v3")
    base = loader.load("hardware", "h200").without_host_overheads()
    graphs = _with_graph_terms(base, 30.0, 900.0)
    assert graphs.replays_graphs and not base.replays_graphs

    def total(hw, query_rows: int, replay: bool = True) -> float:
        cost = CostModel(model, hw, 1, page_size=64, layers=range(8), sparse=False, decode_graphs=replay)
        return float(cost.evaluate(host_overhead.uniform_batch(16, 8192, 1, query_rows)).total_s[0])

    # decode: the device time, t0 of a replayed step and 30 µs per layer; no eager host term
    assert total(graphs, 1) - total(base, 1) == pytest.approx(
        (900.0 - base.step_overhead_us.value + 8 * 30.0) * 1e-6, rel=1e-9)
    eager = graphs.with_host_overheads({l: 1000.0 for l in LAYOUTS}, 1.0, source="measured", ref="t",
                                       date="2026-01-02", machine="m", command="c")
    assert eager.replays_graphs  # given no new replay terms, the profile's stay
    # without decode graphs (deployment mode off), or in prefill, the eager host term applies
    assert total(graphs, 1, replay=False) == pytest.approx(total(graphs.without_host_overheads().with_host_overheads(
        {l: 1000.0 for l in LAYOUTS}, 1.0, source="measured", ref="t", date="2026-01-02", machine="m",
        command="c"), 1))
    assert total(graphs, 16) == total(graphs, 16, replay=False)


def test_replay_terms_come_together_and_are_not_kept_from_a_stale_base():
    base = _with_graph_terms(loader.load("hardware", "cpu").without_host_overheads(), 10.0, 200.0)
    data = calibrate.build_profile({"matmul_tflops": 2.0}, base, name="t", machine="m", command="c",
                                   backend="reference")
    assert loader.from_mapping("hardware", data, file="<t>").replays_graphs  # nothing timed again: kept
    again = calibrate.build_profile({"matmul_tflops": 2.0, "layer_overhead_us": {str(l): 5.0 for l in LAYOUTS},
                                     "host_overlap": 0.5}, base, name="t", machine="m", command="c",
                                    backend="reference")
    assert not loader.from_mapping("hardware", again, file="<t>").replays_graphs  # timed eagerly: not kept
    half = dict(data)
    del half["graph_step_overhead_us"]
    with pytest.raises(loader.ProfileError, match="graph_step_overhead_us: give it together"):
        loader.from_mapping("hardware", half, file="<t>")


def test_static_buffer_decode_is_timed_and_named(rank_pools):
    """The graph path's persistent buffers on the host (nothing captures): the step says so."""
    from splash_core.profiles.graphs import GraphConfig
    from splash_core.runtime import step_timing

    samples = rank_pools(1).run(_time_static, GraphConfig(mode="static"))[0]
    assert {(s["phase"], s["path"]) for s in samples} == {("decode", "static"), ("prefill", "eager")}
    assert all(len(s["step_ms"]) == 2 for s in samples)
    with pytest.raises(ValueError, match="warmup >= 1"):
        step_timing.time_layout(None, profile=None, layout=Layout.TP, layers=1, batch=1, contexts=[8], page_size=16,
                                dtype=torch.float32, kernels=None, warmup=0, graphs=GraphConfig(mode="static"))


def _time_static(ctx, graphs):
    from splash_core.runtime.step_timing import time_layout

    return time_layout(ctx, profile=loader.load("model", "tiny-mla"), layout=Layout.DOP, layers=2, batch=3,
                       contexts=[40], page_size=16, dtype=torch.float32,
                       kernels=ctx.backend.mla_kernels(ctx.device, torch.float32), reps=2, warmup=1, prefill_chunk=4,
                       fused=ctx.backend.fused_kernels(ctx.device, torch.float32), graphs=graphs)


def test_decode_and_prefill_attention_run_at_their_own_kernels_rates():
    """Calibration measures the decode kernel's rate beside the prefill kernel's: a pure decode
    step's attention is charged the first, a step with chunks the second (absent: the same)."""
    import dataclasses

    from splash_core.planning.costmodel import CostModel
    from splash_core.profiles.quantity import Quantity

    model = loader.load("model", "deepseek-v3")
    base = loader.load("hardware", "h200").without_host_overheads()
    slow = Quantity.from_yaml_value({"value": 50.0, "source": "assumed", "ref": "test"}, file="<t>", path="x")
    fast = Quantity.from_yaml_value({"value": 5000.0, "source": "assumed", "ref": "test"}, file="<t>", path="x")
    hw = dataclasses.replace(base, attention_tflops=slow, decode_attention_tflops=fast)

    def att(profile, rows: int) -> float:
        cost = CostModel(model, profile, 1, page_size=64, layers=range(1), sparse=False)
        return float(cost.evaluate(host_overhead.uniform_batch(16, 65536, 1, rows)).att_s[0])

    flops = 2 * 128 * (576 + 512)
    assert att(hw, 16) == pytest.approx(16 * (16 * 65536 - 16 * 15 // 2) * flops / 50e12)  # compute-bound
    assert att(hw, 1) < att(dataclasses.replace(hw, decode_attention_tflops=None), 1)  # decode: the decode rate
    assert att(hw, 1) == pytest.approx(16 * 65536 * (576 * 2) / (base.kv_read_gbps.value * 1e9))  # KV-read-bound


def test_fit_theta_tells_replayed_decode_from_eager_prefill():
    """Steps made by the cost model's own law (eager prefill: t0 + L (d + [h - η d]+) + ffn;
    replayed decode: t0_g + L (d + g) + ffn) give back its constants."""
    from splash_core.planning.costmodel import CostModel

    spec = calibrate_runtime.RuntimeSpec.choose(accelerator=True, quick=True)  # DeepSeek-V3 dims, 4 and 1 layers
    hw = loader.load("hardware", "h200").without_host_overheads()
    model, t0, t0_g, eta = calibrate_runtime.runtime_model(spec), 600e-6, 900e-6, 0.8
    host = {Layout.TP: 900e-6, Layout.CP: 1300e-6, Layout.DP: 700e-6, Layout.DOP: 1100e-6}
    gap = {Layout.TP: 20e-6, Layout.CP: 45e-6, Layout.DP: 10e-6, Layout.DOP: 30e-6}
    samples = [{"layout": "TP", "layers": 0, "batch": spec.batch, "context": c, "seconds": t0} for c in spec.contexts]
    for layout in LAYOUTS:
        for layers, phase, rows, replay in ((spec.layers, "prefill", spec.prefill_chunk, False),
                                            (spec.layers, "decode", 1, True), (spec.short_layers, "decode", 1, True),
                                            (spec.layers, "decode", 1, False)):
            cost = CostModel(model, hw, 1, page_size=spec.page_size, layers=range(layers), sparse=False)
            for context in spec.contexts:
                x = host_overhead.uniform_batch(spec.batch, context, 1, rows)
                d, ffn = host_overhead.device_layer_time(cost, x, layout), cost.evaluate(x).step_time(layout).ffn_s
                seconds = ((t0_g + layers * (d + gap[layout])) if replay
                           else (t0 + layers * (d + max(0.0, host[layout] - eta * d)))) + ffn
                samples.append({"layout": str(layout), "layers": layers, "batch": spec.batch, "context": context,
                                "seconds": seconds, "phase": phase, "rows": rows,
                                "path": "replay" if replay else "eager"})
    theta = calibrate_runtime.fit_theta(samples, hw, spec, 1, "bf16")
    assert theta["step_overhead_us"] == pytest.approx(t0 * 1e6)
    assert theta["graph_step_overhead_us"] == pytest.approx(t0_g * 1e6, rel=1e-6)
    assert theta["host_overlap"] == pytest.approx(eta, abs=0.011)  # η on a grid of 0.01
    for layout in LAYOUTS:
        assert theta["graph_layer_overhead_us"][str(layout)] == pytest.approx(gap[layout] * 1e6, rel=1e-6)
        assert theta["layer_overhead_us"][str(layout)] == pytest.approx(host[layout] * 1e6, rel=0.02)
    assert "replayed from captured graphs" in theta["methods"]["graph_step_overhead_us"]
    assert "fitted to the prefill chunks and eagerly run decode steps" in theta["methods"]["layer_overhead_us"]
    data = calibrate.build_profile({"matmul_tflops": 1.0, **theta}, loader.load("hardware", "h200"), name="t",
                                   machine="m", command="c", backend="hopper", date="2026-01-02")
    profile = loader.from_mapping("hardware", data, file="<t>")
    assert profile.replays_graphs and {s.path for s in profile.step_samples} == {"eager", "replay"}


class _HostGraph:
    """A 'captured graph' on the host: replay runs the function again into the outputs."""

    def __init__(self, fn):
        self.fn, self.capture_s, self.nbytes = fn, 0.0, 0
        self.outputs = tuple(None if t is None else t.clone() for t in fn())

    def replay(self):
        for out, new in zip(self.outputs, self.fn()):
            if out is not None:
                out.copy_(new)


class _HostGraphOps:
    def new_pool(self):
        return None

    def capture(self, fn, pool, warmup=2):
        for _ in range(warmup):
            fn()
        return _HostGraph(fn)


def test_replayed_decode_is_timed_and_named(rank_pools):
    from splash_core.profiles.graphs import GraphConfig

    samples = rank_pools(1).run(_time_replayed, GraphConfig(mode="static"))[0]
    assert {(s["phase"], s["path"]) for s in samples} == {("decode", "replay"), ("prefill", "eager")}
    assert all(min(s["step_ms"]) > 0 for s in samples)


def _time_replayed(ctx, graphs):
    from splash_core.runtime.step_timing import time_layout

    return time_layout(ctx, profile=loader.load("model", "tiny-mla"), layout=Layout.CP, layers=2, batch=3,
                       contexts=[40, 70], page_size=16, dtype=torch.float32,
                       kernels=ctx.backend.mla_kernels(ctx.device, torch.float32), reps=2, warmup=1, prefill_chunk=4,
                       graphs=graphs, graph_ops=_HostGraphOps())


def test_runtime_timing_where_the_backend_captures(rank_pools):
    """time_steps with a backend that captures (a host stand-in for graph ops): decode replayed at
    two layer counts and eagerly, prefill eagerly; fit_theta then gives the replay terms too."""
    spec = calibrate_runtime.RuntimeSpec.choose(accelerator=False, quick=True)
    samples = rank_pools(1).run(_time_steps_capturing, spec)[0]
    kinds = {(s["layers"], s["phase"], s["path"]) for s in samples}
    assert kinds == {(0, "decode", "eager"), (spec.layers, "decode", "replay"), (spec.layers, "prefill", "eager"),
                     (spec.short_layers, "decode", "replay"), (spec.layers, "decode", "eager")}
    theta = calibrate_runtime.fit_theta(samples, loader.load("hardware", "cpu"), spec, 1, "fp32")
    assert set(theta["graph_layer_overhead_us"]) == {str(l) for l in LAYOUTS} and theta["graph_step_overhead_us"] >= 0


def _time_steps_capturing(ctx, spec):
    ops = ctx.backend.graph_ops
    ctx.backend.graph_ops = lambda device: _HostGraphOps()
    try:
        return calibrate_runtime.time_steps(ctx, spec, "fp32")
    finally:
        ctx.backend.graph_ops = ops
