"""``splash calibrate``: the generic θ measurement on gloo ranks, the collective fit, and
the hardware profile it writes (measured entries carry date, machine and command)."""

from __future__ import annotations

import pytest
import torch
import yaml

from splash_core import calibrate
from splash_core.cli.main import main
from splash_core.profiles import loader

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
    assert main(["calibrate", "--backend", "reference", "--ranks", "1", "--quick", "--out", str(out)]) == 0
    profile = loader.load("hardware", str(out))
    assert profile.name == "host" and profile.matmul_tflops.source == "measured"
    assert "--backend reference --ranks 1" in profile.matmul_tflops.command
    assert profile.all_gather_gbps == loader.load("hardware", "cpu").all_gather_gbps  # one rank: kept from base
    assert "wrote" in capsys.readouterr().out
    assert yaml.safe_load(out.read_text())["kind"] == "hardware"


def test_cli_rejects_bad_input(tmp_path, capsys):
    assert main(["calibrate", "--backend", "reference", "--ranks", "0", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "--ranks must be >= 1" in capsys.readouterr().err
    assert main(["calibrate", "--backend", "nosuch", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "no backend named 'nosuch'" in capsys.readouterr().err
    assert main(["calibrate", "--backend", "reference", "--base", "nosuch", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "no hardware profile 'nosuch'" in capsys.readouterr().err


def test_shipped_cpu_profile_is_measured():
    profile = loader.load("hardware", "cpu")
    for key in KEYS:
        assert getattr(profile, key).source == "measured", key
    assert profile.collective_samples
