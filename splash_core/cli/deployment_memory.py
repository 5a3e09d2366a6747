"""``splash capacity --deployment D [--model DIR]``: what one rank holds in each layout, from the
tensors the runtime would load (headers or config.json only), and the KV the rest buys."""

from __future__ import annotations

import dataclasses

from ..checkpoint.deployments import resolve
from ..checkpoint.footprint import PARTS
from ..engine.memory_plan import deployment_memory, refusal
from ..profiles import load
from ..profiles.hardware import GIB
from .output import print_json, table

SHORT = {"attention (head-indexed)": "attn heads", "attention (replicated)": "attn repl", "experts": "experts",
         "mlp": "mlp", "embed/head": "embed/head", "norms": "norms"}


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def rows(plan) -> list[dict]:
    return [{"layout": str(m.layout), "rank": m.rank, "parts_bytes": m.parts, "fp8_parts_bytes": m.fp8_parts,
             "weights_bytes": m.weights, "fp8_weights_bytes": m.fp8_weights, "graphs_bytes": m.graphs,
             "reserve_bytes": m.reserve, "budget_bytes": m.budget, "left_bytes": m.left(),
             "fp8_left_bytes": m.left(True), "kv_tokens_per_rank": m.kv_tokens(),
             "fp8_kv_tokens_per_rank": m.kv_tokens(True)} for m in plan.layouts]


def run(args) -> int:
    deployment = resolve(args.deployment, model=args.model)
    if args.hardware is not None:
        deployment = dataclasses.replace(deployment, hardware=load("hardware", args.hardware))
    plan = deployment_memory(deployment)
    problem = refusal(plan)
    if args.json:
        print_json({"deployment": deployment.name, "T": plan.T, "held": plan.held,
                    "tensors_from": plan.source, "layouts": rows(plan), "refusal": problem,
                    "fp8_kept_is": "FP8 tensors kept as stored (codes + block scales), the rest as held"})
        return 0
    hw = deployment.hardware
    print(f"{deployment.name}: T = {plan.T} on {hw.name} ({hw.memory_gib.value:g} GiB x memory_fraction "
          f"{deployment.memory_fraction:g} = {_gib(plan.layouts[0].budget)} GiB per rank); tensors from {plan.source}")
    body = [(str(m.layout), m.rank, *(_gib(m.parts[p]) for p in PARTS), _gib(m.weights), _gib(m.fp8_weights),
             _gib(m.graphs), _gib(m.reserve), _gib(m.left()), f"{m.kv_tokens():,}", f"{m.kv_tokens(True):,}")
            for m in plan.layouts]
    heads = ["layout", "rank", *(SHORT[p] for p in PARTS), "weights held", "weights FP8-kept",
             "graphs", "reserve", "left", "KV tok/rank", "KV tok/rank FP8-kept"]
    print(table(body, heads, align="lr" + "r" * (len(heads) - 2)))
    print(f"\nGiB per rank (busiest rank). Weights as the runtime holds them ({plan.held}; FP8 tensors held "
          "otherwise are dequantized at load) and FP8-kept (every FP8 tensor kept as stored: codes + block scales; "
          "ffn_weights: fp8 keeps the feed-forward ones, attention_weights: fp8 Q-B, KV-B and O). 'left' buys the KV "
          "pool (a run sizes its pool by it, on the tightest layout its policy may run): KV tok/rank = pages of every "
          "cache-bearing layer x page size. Activation scratch is inside the reserve; the profile's common_gib "
          f"({deployment.common_gib:g}) is used only by the paper studies (sweep, decide, plan).")
    if problem:
        print(f"\n{problem}")
    return 0
