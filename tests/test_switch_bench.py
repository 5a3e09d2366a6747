"""bench/switch_bench.py's logic on CPU with tiny shapes (--smoke), so its first GPU run does not
fail on a bug a CPU could have caught; and its sizing of the overhead table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from splash_core import results
from splash_core.layouts import DIRECTIONS
from splash_core.profiles.loader import load

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "switch_bench.py"
PAIRS = {(str(a), str(b)) for a, b in DIRECTIONS}


def _bench():
    spec = importlib.util.spec_from_file_location("switch_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_writes_valid_results(rank_pools, tmp_path):
    bench = _bench()
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


def test_table_sizing_follows_memory_and_time():
    bench = _bench()
    v3 = load("model", "deepseek-v3")
    args = bench.parse_args(["--out", "unused"])
    held, transit = bench.layer_bytes(v3, 2, 16, 131072, 64, 2)
    assert held > 16 * 131072 * 576 * 2  # TP's whole history per layer, plus weights
    fit, memory = bench.layers_that_fit(args, v3, 131072, 120 * (1 << 30))
    assert memory["fixed_bytes"] + fit * held <= 120 * (1 << 30) < memory["fixed_bytes"] + (fit + 1) * held
    steps = [{"context": c, "layout": l, "layer_ms": 1.0 * c / 32768, "fixed_ms": 1.0, "layers": 2}
             for c in args.contexts for l in ("TP", "CP", "DP", "DOP")]
    prims = [{"state": "kv", "src": a, "dst": b, "per_layer_ms": 4.0} for a, b in PAIRS]
    context, layers, why = bench.choose_table(args, v3, {"steps": steps, "samples": prims}, 120 * (1 << 30), 150.0)
    # cost per run grows with the context, so a long context leaves time for fewer layers
    fits = {c["context"]: c["time_fit"] for c in why["candidates"]}
    assert fits[32768] > fits[65536] > fits[131072]
    assert layers >= args.min_layers and context == max(c for c, n in fits.items() if n >= args.min_layers)
