"""``splash decide --deployment FILE --requests "16x128k"``: one decision of the scheduler
π(x; θ) for a batch, with its explanation (per-layout step time and memory, Eq 6 and Eq 5)."""

from __future__ import annotations

import math

from ..formatting import percent, size
from ..layouts import LAYOUTS, Layout
from ..planning.costmodel import BatchArrays
from ..planning.ownership import assign_owners
from ..planning.scheduler import Scheduler
from ..profiles import load
from .args import UsageError, at_least
from .output import GIB, print_json, table
from .plan import check_requests_bound, parse_tokens

PHASES = ("decode", "prefill", "mixed")
PREFILL_CHUNK = 8192  # rows a prefill step gives a request when --query-rows is not set


def add_parser(sub) -> None:
    p = sub.add_parser("decide", help="which layout the scheduler runs for a batch, and why (Eq 5, 6, 8, 10)")
    p.add_argument("--deployment", required=True, help="deployment profile: name or path to a .yaml")
    p.add_argument("--requests", required=True,
                   help='running requests as COUNTxCONTEXT groups, e.g. "16x128k" or "4x8k,2x100k" (k = 1024)')
    p.add_argument("--current", help="layout the group runs now (default: the deployment's initial layout)")
    p.add_argument("--phase", choices=PHASES, default=None,
                   help="decode: one query row per request (default); prefill: every request prefills a chunk "
                        "of --query-rows rows (default 8192); mixed: the first COUNTxCONTEXT group prefills, "
                        "the others decode")
    p.add_argument("--query-rows", type=at_least(1), default=None,
                   help="query rows per request this step: 1 in decode (default), the chunk in prefill")
    p.add_argument("--remaining-output", default="0",
                   help="output tokens each request may still generate, reserved by Eq 6 (default 0)")
    p.add_argument("--steps-since-switch", type=at_least(0), help="steps since the last switch (default: long ago)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def parse_groups(text: str) -> list[list[int]]:
    """'4x8k,2x100k' -> [[8192] * 4, [102400] * 2]."""
    parsed = []
    for group in text.split(","):
        count, sep, tokens = group.strip().lower().partition("x")
        if not sep or not count.strip().isdigit():
            raise UsageError(f"bad request group {group.strip()!r}: expected COUNTxCONTEXT, e.g. 16x128k")
        context = parse_tokens(tokens)
        if context < 1:
            raise UsageError(f"bad request group {group.strip()!r}: a context must be at least 1 token")
        parsed.append((int(count), context))
    check_requests_bound(sum(count for count, _ in parsed), "--requests")  # before any list is built
    groups = [[context] * count for count, context in parsed]
    if not any(groups):
        raise UsageError("no requests given")
    return groups


def phase_rows(groups: list[list[int]], phase: str | None, query_rows: int | None) -> list[int]:
    """Query rows per request: ``query_rows`` for every request without ``phase`` (1 by
    default); a chunk for prefilling requests (every request in prefill, the first group in
    mixed), one row for decoding ones."""
    if query_rows is not None and query_rows < 1:
        raise UsageError(f"--query-rows must be >= 1 (got {query_rows})")
    if phase is None:
        return [query_rows or 1] * sum(map(len, groups))
    if phase == "mixed" and len(groups) < 2:
        raise UsageError('--phase mixed needs two request groups, e.g. "2x32k,14x8k" (the first prefills)')
    chunk = query_rows or PREFILL_CHUNK
    prefilling = len(groups) if phase == "prefill" else (1 if phase == "mixed" else 0)
    return [chunk if i < prefilling else 1 for i, group in enumerate(groups) for _ in group]


def run(args) -> int:
    deployment = load("deployment", args.deployment)
    groups = parse_groups(args.requests)
    contexts = [c for group in groups for c in group]
    rows = phase_rows(groups, args.phase, args.query_rows)
    try:
        current = Layout.parse(args.current) if args.current else deployment.initial_layout
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    remaining = parse_tokens(args.remaining_output)
    reserved = [c + remaining for c in contexts]
    owners = assign_owners(reserved, deployment.T)  # least projected KV first, as admission does
    x = BatchArrays.of(contexts, owners, query_rows=rows, reserved=reserved)
    since = math.inf if args.steps_since_switch is None else args.steps_since_switch
    scheduler = Scheduler(deployment)
    decision = scheduler.decide(x, current, since)
    cost = scheduler.switch_cost(decision, x)
    graphs = scheduler.cost.graph_costs
    if args.json:
        out = _decision_json(scheduler, decision, cost, x)
        out.update({"deployment": deployment.name, "requests": len(contexts), "total_context": sum(contexts),
                    "phase": args.phase or ("decode" if max(rows) == 1 else "prefill"),
                    "query_rows": int(sum(min(r, c) for r, c in zip(rows, contexts))),
                    "note": "predicted by the cost model (Eq 10) with the hardware profile's θ, not measured"})
        print_json(out)
        return 0
    n_rows = sum(min(r, c) for r, c in zip(rows, contexts))
    phase = args.phase or ("decode" if max(rows) == 1 else "prefill")
    print(f"{deployment.name}: {len(contexts)} requests, {sum(contexts):,} context tokens, "
          f"T = {deployment.T}, current {current}; {phase} step of {n_rows:,} query rows")
    print(_layout_table(decision, current))
    print(f"\nbudget {size(decision.budget_bytes)} per rank; margin {percent(decision.margin, decimals=0)}; the batch "
          f"reserves {decision.demand_tokens:,.0f} distinct tokens of KV, so admitted in waves it would take the "
          f"last column's waves per layout (SPLASH's engine admits continuously: a layout whose pool needs more "
          f"than one holds admission)")
    print(f"decision: {decision.reason}")
    if cost is not None:
        print(scheduler.explain_switch_cost(decision, cost, x))
    if graphs is not None:
        print(f"decode graphs in Eq 6's A per rank (one pool for every layout and bucket): {size(graphs.pool_bytes)}")
    print("(predicted by the cost model with the hardware profile's θ; not a measurement)")
    return 0


def _decision_json(scheduler: Scheduler, decision, cost, x: BatchArrays) -> dict:
    """The decision's mapping with its switch's cost and each layout's decode graphs."""
    graphs = scheduler.cost.graph_costs
    graph_bytes = None if graphs is None else graphs.held_bytes(x)
    out = decision.as_dict()
    if cost is not None:
        out["switch_cost"] = {"exposed_s": cost.exposed_s, "transfer_exposed_s": cost.transfer_exposed_s,
                              "recapture_s": cost.recapture_s, "blocking_s": cost.blocking_s,
                              "explanation": scheduler.explain_switch_cost(decision, cost, x)}
    for row in out["layouts"]:
        row["graph_gib"] = 0.0 if graph_bytes is None else float(graph_bytes[LAYOUTS.index(row["layout"])]) / GIB
    return out


def _layout_table(decision, current: Layout) -> str:
    table_rows = []
    for r in decision.layout_rows():
        eq5 = "-" if r["switch_eq5"] is None else (
            f"{'fits' if r['switch_eq5'] else 'exceeds'} ({size(r['switch_peak_gib'] * GIB)}, {r['eq5_how']})")
        parts = "/".join(f"{r[k] * 1e3:.1f}" for k in ("proj_s", "att_s", "exposed_comm_s", "ffn_s"))
        table_rows.append((str(r["layout"]), r["time_s"] * 1e3, percent(-r["vs_current"], signed=True), parts,
                           size(r["need_gib"] * GIB), "fits" if r["fits_eq6"] else "exceeds", eq5,
                           f"{r['bounds']['proj']}/{r['bounds']['att']}", _pool(r)))
    return table(table_rows, ["layout", "step ms", f"vs {current}", "proj/att/comm/shared ms", "per rank", "Eq 6",
                              "Eq 5 switch", "proj/att bound", "KV pool (tokens): waves"], align="lrrrrlllr")


def _pool(row: dict) -> str:
    """The layout's KV pool over the group and the admission waves the batch would take in it."""
    if row["pool_tokens"] is None or row["waves"] is None:
        return "none"
    return f"{row['pool_tokens']:,.0f}: {row['waves']}"
