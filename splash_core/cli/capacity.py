"""``splash capacity --scenario FILE``: the longest nominal input each layout keeps resident
(appendix B's KV residency sampler), beside the paper's printed limits.

``splash capacity --deployment D [--model DIR]``: per-rank memory of a deployment in each layout,
from the tensors its ranks would load (:mod:`splash_core.engine.memory_plan`): weights by part as
held today and FP8-kept, graphs, reserve, and the KV the rest buys."""

from __future__ import annotations

import time

from ..formatting import number, percent
from ..profiles import load
from ..studies import capacity
from .args import UsageError
from .output import print_json, table


def add_parser(sub) -> None:
    p = sub.add_parser("capacity", help="KV residency limits per layout for a scenario (appendix B), or a "
                                        "deployment's per-rank memory by layout")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--scenario", help="scenario profile: name or path to a .yaml")
    what.add_argument("--deployment", help="deployment profile: per-rank memory of each layout, from its tensors")
    p.add_argument("--model", help="with --deployment: a checkpoint folder (safetensors headers, or config.json alone)")
    p.add_argument("--hardware", help="with --deployment: plan on this hardware profile instead of the deployment's")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def fmt_k(tokens: float | None, decimals: int) -> str:
    """Tokens in the paper's unit, 1k = 1024 tokens."""
    return "-" if tokens is None else f"{tokens / 1024:.{decimals}f}k"


def limit_rows(scenario, limits) -> list[dict]:
    paper = scenario.paper.limits_k if scenario.paper else {}
    rows = []
    for layout, lim in limits.items():
        printed = paper.get(layout)
        k = None if lim.tokens is None else lim.tokens / 1024
        rows.append({
            "layout": str(layout), "pool_tokens_per_rank": lim.pool, "limit_tokens": lim.tokens, "limit_k": k,
            "source": lim.source, "paper_k": printed,
            "diff_percent": None if printed is None or k is None else 100.0 * (k - printed) / printed,
        })
    return rows


def run(args) -> int:
    if args.deployment is not None:
        from . import deployment_memory  # the engine's import is for this form only

        return deployment_memory.run(args)
    if args.model is not None or args.hardware is not None:
        raise UsageError(f"{'--model' if args.model is not None else '--hardware'} goes with --deployment")
    scenario = load("scenario", args.scenario)
    spec = scenario.capacity
    start = time.perf_counter()
    limits = capacity.scenario_limits(spec, tuple(scenario.timing.layouts))  # the figure's order
    seconds = time.perf_counter() - start
    rows = limit_rows(scenario, limits)
    if args.json:
        print_json({"scenario": scenario.name, "title": scenario.title, "batch": spec.batch, "T": spec.T,
                    "cohorts": spec.cohorts, "seed": spec.seed, "target": spec.target, "limits": rows,
                    "sampling_seconds": seconds, "paper_values_are": "printed in the paper, for comparison"})
        return 0
    d = scenario.display_decimals
    print(f"{scenario.title}  ({scenario.source})")
    print(f"B = {spec.batch}, T = {spec.T}; inputs uniform in [floor({spec.input_low_fraction:g}·L), L], "
          f"outputs uniform in [{spec.output_tokens[0]}, {spec.output_tokens[1]}]; "
          f"{spec.cohorts:,} cohorts, PCG64 seed {spec.seed}, {spec.target:.0%} all-rank residency")
    if spec.budget is not None:
        b = spec.budget
        print(f"memory: {b.attention_budget_gib:g} GiB per rank for attention weights + KV "
              f"(+ {b.reserve_gib:g} GiB separate reserve), {b.attention_weights_gib:g} GiB full attention weights, "
              f"{b.kv_bytes_per_token:,.0f} KV bytes per token")
    body = [(r["layout"], "-" if r["pool_tokens_per_rank"] is None else f"{r['pool_tokens_per_rank']:,}",
             fmt_k(r["limit_tokens"], d), r["source"], "-" if r["paper_k"] is None else f"{number(r['paper_k'])}k",
             "-" if r["diff_percent"] is None else percent(r["diff_percent"] / 100, signed=True, decimals=2))
            for r in rows]
    print(table(body, ["layout", "pool tokens/rank", "limit", "how", "paper", "diff"], align="lrrlrr"))
    print(f"\nsampled in {seconds:.1f} s; 'paper' is the paper's printed value (1k = 1024 tokens), not a measurement")
    return 0
