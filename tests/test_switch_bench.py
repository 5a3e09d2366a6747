"""bench/switch_bench.py's logic on CPU with tiny shapes (--smoke), so its first GPU run does not
fail on a bug a CPU could have caught; and its sizing of the overhead table (layers by memory,
runs by time)."""

from __future__ import annotations

from bench_scripts import load_bench

from splash_core import results
from splash_core.layouts import DIRECTIONS
from splash_core.profiles.loader import load

PAIRS = {(str(a), str(b)) for a, b in DIRECTIONS}


def test_smoke_run_writes_valid_results(rank_pools, tmp_path):
    bench = load_bench("switch_bench")
    args = bench.parse_args(["--smoke", "--out", str(tmp_path)])
    assert bench.run(args, rank_pools(2)) == 0
    prim = results.read_result(tmp_path / "cpu" / "primitive_costs.json")
    costs = prim["summary"]["costs"]
    assert {(c["src"], c["dst"]) for c in costs} == PAIRS and {c["state"] for c in costs} == {"weights", "kv"}
    network = [c for c in costs if c["primitive"] != "discard"]
    # Figure 3 (right): four weight all-gathers (into DP/CP from TP/DOP), seven KV collectives
    assert sorted((c["state"], c["primitive"]) for c in network).count(("weights", "all_gather")) == 4
    assert sum(c["state"] == "kv" for c in network) == 7
    assert all(c["per_layer_ms"] > 0 and c["bytes"] > 0 for c in network)
    assert {(b["state"], b["src"], b["dst"]) for b in prim["bare_collectives"]} == \
        {(c["state"], c["src"], c["dst"]) for c in network}
    table = results.read_result(tmp_path / "cpu" / "switch_overhead.json")
    rows = table["summary"]["directions"]
    assert {(r["src"], r["dst"]) for r in rows} == PAIRS and all(r["runs"] == args.runs for r in rows)
    assert not table["skipped"] and table["layers"] == 3
    crossing = {(t["src"], t["dst"]) for t in table["targets"] if t["crosses_network"]}
    assert crossing == PAIRS - {("TP", "DOP"), ("DP", "DOP")}  # the two pure discards
    parts = table["splash_parts"]  # SPLASH minus ready, split by cause, every direction
    assert set(parts) == {f"{a}->{b}" for a, b in PAIRS} and all(p["runs"] == args.runs for p in parts.values())
    waits = ("first_wait_ms_p50", "later_waits_ms_p50", "after_last_ms_p50")
    assert all(sum(p[w] for w in waits) > 0 for p in parts.values())  # gloo's transfers block the host there
    # the first layer moves after the step where it crosses the network, so the step waits after its last layer
    assert all((parts[f"{a}->{b}"]["after_last_ms_p50"] > 0) == ((a, b) in crossing) for a, b in PAIRS)


def test_overhead_parts_add_up_to_the_overhead():
    bench = load_bench("switch_bench")
    ready = {"before_first_ms": 1.0, "first_wait_ms": 0.0, "later_waits_ms": 0.0, "compute_ms": 10.0,
             "after_last_ms": 0.0}
    splash = {"before_first_ms": 1.5, "first_wait_ms": 2.0, "later_waits_ms": 0.25, "compute_ms": 11.0,
              "after_last_ms": 0.5}
    rows = [{"src": "TP", "dst": "CP", "run": run, "mode": mode, **parts}
            for run in range(3) for mode, parts in (("ready", ready), ("splash", splash))]
    rows.append({"src": "TP", "dst": "CP", "run": 3, "mode": "ready", **ready})  # a run without its SPLASH step
    (key, got), = bench.overhead_parts(rows, warmup=1).items()
    assert key == "TP->CP" and got["runs"] == 2
    assert [got[f"{p}_p50"] for p in bench.PARTS] == [0.5, 2.0, 0.25, 1.0, 0.5]


def test_table_sizing_by_memory_then_time():
    bench = load_bench("switch_bench")
    v3 = load("model", "deepseek-v3")
    args = bench.parse_args(["--out", "unused", "--min-runs", "8"])  # the times below were sized for 8
    held, transit = bench.layer_bytes(v3, 2, 16, 131072, 64, 2)
    assert held > 16 * 131072 * 576 * 2  # TP's whole history per layer, plus weights
    fit, memory = bench.layers_that_fit(args, v3, 131072, 120 * (1 << 30))
    assert memory["fixed_bytes"] + fit * held <= 120 * (1 << 30) < memory["fixed_bytes"] + (fit + 1) * held
    steps = [{"context": c, "layout": l, "layer_ms": 1.0 * c / 32768, "fixed_ms": 1.0, "layers": 2}
             for c in args.contexts for l in ("TP", "CP", "DP", "DOP")]
    phase1 = {"steps": steps, "samples": [{"state": "kv", "src": a, "dst": b, "per_layer_ms": 4.0} for a, b in PAIRS]}

    def table(seconds):
        context, layers, runs, why = bench.choose_table(args, v3, phase1, 120 * (1 << 30), seconds)
        return context, layers, runs, {c["context"]: c for c in why["candidates"]}

    # time to spare: the longest context, every layer that fits memory (at most the model's), the most runs
    context, layers, runs, cands = table(1e6)
    assert (context, runs) == (131072, args.runs) and layers == min(v3.num_layers, cands[131072]["memory_fit"])
    # less time: runs shrink first (never below --min-runs), then layers; a long context costs more per layer
    for seconds in (150.0, 60.0):
        context, layers, runs, cands = table(seconds)
        assert all(args.min_runs <= c["runs"] <= args.runs for c in cands.values())
        assert all(c["layers"] <= min(v3.num_layers, c["memory_fit"]) for c in cands.values())
        assert layers >= args.min_layers and context == max(c for c, x in cands.items() if x["layers"] >= args.min_layers)
        per_run = sum(cands[context]["est_run_ms_per_layer"].values()) * layers + sum(cands[context]["est_run_ms_fixed"].values())
        assert (runs + 1) * per_run / 1e3 <= 0.85 * seconds - 20
    assert cands[32768]["layers"] > cands[65536]["layers"] > cands[131072]["layers"]
    assert context == 32768 and runs == args.min_runs  # 60 s: only the short context keeps --min-layers


def test_host_profile_writes_valid_results(rank_pools, tmp_path):
    """bench/switch_host_profile.py on a tiny batch: one network and one discard direction."""
    host = load_bench("switch_host_profile")
    args = host.parse_args(["--out", str(tmp_path), "--layers", "2", "--batch", "4", "--context", "128",
                            "--page-size", "16", "--runs", "1", "--directions", "CP-TP,TP-DOP", "--indexer"])
    assert host.run(args, rank_pools(2)) == 0
    data = results.read_result(tmp_path / "cpu" / "switch_host_profile.json")
    rows = {(r["src"], r["dst"]): r for r in data["summary"]["directions"]}
    assert set(rows) == {("CP", "TP"), ("TP", "DOP")} and data["summary"]["layers"] == 2
    assert rows[("CP", "TP")]["data_p50_ms"] > 0 and rows[("TP", "DOP")]["data_p50_ms"] == 0  # a discard moves nothing
    assert all(r["switch_host_p50_ms"] >= r["prepare_p50_ms"] > 0 for r in rows.values())
    assert "pages_mover.py" in data["profile"]  # the executor's own calls, under cProfile


def test_copy_interference_smoke_writes_every_variant(tmp_path):
    """The one-GPU interference probe's logic on the CPU: a row per copy kind and size, every
    copy kind's step timed beside the same pages."""
    script = load_bench("copy_interference")
    assert script.main(["--smoke", "--out", str(tmp_path)]) == 0
    data = results.read_result(tmp_path / "cpu" / "copy_interference.json")
    rows = data["summary"]["rows"]
    assert [r["variant"] for r in rows] == ["kernels", "memcpy", "pull", "pull_pitched", "spin"]
    assert len({r["step_alone_ms"] for r in rows}) == 1 and all(r["copy_alone_ms"] > 0 for r in rows)
    assert {s["variant"] for s in data["samples"]} == {"alone", "kernels", "memcpy", "pull", "pull_pitched", "spin"}
    lengths = data.data["run_lengths"]
    assert [(r["pitched"], r["run_pages"]) for r in lengths] == [(False, 1), (False, 4), (True, 1), (True, 4)]
    assert lengths[-1]["copies"] < lengths[-2]["copies"]  # 4 rows in a pitched copy


def test_precopy_step_writes_valid_results(rank_pools, tmp_path):
    """bench/precopy_step.py on a tiny batch: the handoff receives only the dirty tails (the last
    page of each history), a fraction of what the one-step switch receives."""
    script = load_bench("precopy_step")
    args = script.parse_args(["--out", str(tmp_path), "--layers", "2", "--batch", "4", "--context", "128",
                              "--page-size", "16", "--runs", "1", "--directions", "DP-TP,CP-DP", "--precopy-steps", "2"])
    assert script.run(args, rank_pools(2)) == 0
    data = results.read_result(tmp_path / "cpu" / "precopy_step.json")
    rows = {(r["src"], r["dst"]): r for r in data["summary"]["directions"]}
    assert set(rows) == {("DP", "TP"), ("CP", "DP")}
    for r in rows.values():
        assert 0 < r["handoff_kv_bytes"] <= r["one_step_kv_bytes"] / 4 and r["paused_steps"] == 0
        assert r["precopy_host_p50_ms"] > 0 and r["ordinary_p50_ms"] > 0
    kinds = [s["kind"] for s in data["samples"] if (s["src"], s["dst"]) == ("DP", "TP")]
    assert kinds == ["ordinary", "precopy", "precopy", "handoff", "one_step"]
