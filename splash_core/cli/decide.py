"""``splash decide --deployment FILE --requests "16x128k"``: one decision of the scheduler
π(x; θ) for a batch, with its explanation (per-layout step time and memory, Eq 6 and Eq 5)."""

from __future__ import annotations

import math

from ..costmodel import BatchArrays
from ..formatting import percent, size
from ..layouts import Layout
from ..ownership import assign_owners
from ..profiles import load
from ..scheduler import Scheduler
from .args import at_least
from .main import UsageError
from .output import GIB, print_json, table
from .plan import parse_tokens


def add_parser(sub) -> None:
    p = sub.add_parser("decide", help="which layout the scheduler runs for a batch, and why (Eq 5, 6, 8, 10)")
    p.add_argument("--deployment", required=True, help="deployment profile: name or path to a .yaml")
    p.add_argument("--requests", required=True,
                   help='running requests as COUNTxCONTEXT groups, e.g. "16x128k" or "4x8k,2x100k" (k = 1024)')
    p.add_argument("--current", help="layout the group runs now (default: the deployment's initial layout)")
    p.add_argument("--query-rows", type=at_least(1), default=1,
                   help="query rows per request this step: 1 in decode (default), the chunk in prefill")
    p.add_argument("--remaining-output", default="0",
                   help="output tokens each request may still generate, reserved by Eq 6 (default 0)")
    p.add_argument("--steps-since-switch", type=at_least(0), help="steps since the last switch (default: long ago)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def parse_requests(text: str) -> list[int]:
    """'16x128k' or '4x8k,2x100k' -> one context per request."""
    contexts = []
    for group in text.split(","):
        count, sep, tokens = group.strip().lower().partition("x")
        if not sep or not count.strip().isdigit():
            raise UsageError(f"bad request group {group.strip()!r}: expected COUNTxCONTEXT, e.g. 16x128k")
        context = parse_tokens(tokens)
        if context < 1:
            raise UsageError(f"bad request group {group.strip()!r}: a context must be at least 1 token")
        contexts += [context] * int(count)
    if not contexts:
        raise UsageError("no requests given")
    return contexts


def run(args) -> int:
    deployment = load("deployment", args.deployment)
    contexts = parse_requests(args.requests)
    try:
        current = Layout.parse(args.current) if args.current else deployment.initial_layout
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    remaining = parse_tokens(args.remaining_output)
    reserved = [c + remaining for c in contexts]
    owners = assign_owners(reserved, deployment.T)  # least projected KV first, as admission does
    x = BatchArrays.of(contexts, owners, query_rows=[args.query_rows] * len(contexts), reserved=reserved)
    since = math.inf if args.steps_since_switch is None else args.steps_since_switch
    decision = Scheduler(deployment).decide(x, current, since)
    if args.json:
        out = decision.as_dict()
        out.update({"deployment": deployment.name, "requests": len(contexts), "total_context": sum(contexts),
                    "note": "predicted by the cost model (Eq 10) with the hardware profile's θ, not measured"})
        print_json(out)
        return 0
    print(f"{deployment.name}: {len(contexts)} requests, {sum(contexts):,} context tokens, "
          f"T = {deployment.T}, current {current}")
    rows = []
    for r in decision.layout_rows():
        eq5 = "-" if r["switch_eq5"] is None else (
            f"{'fits' if r['switch_eq5'] else 'exceeds'} ({size(r['switch_peak_gib'] * GIB)}, {r['eq5_how']})")
        rows.append((str(r["layout"]), r["time_s"] * 1e3, percent(-r["vs_current"], signed=True),
                     size(r["need_gib"] * GIB), "fits" if r["fits_eq6"] else "exceeds", eq5,
                     f"{r['bounds']['proj']}/{r['bounds']['att']}"))
    print(table(rows, ["layout", "step ms", f"vs {current}", "per rank", "Eq 6", "Eq 5 switch", "proj/att bound"],
                align="lrrrlll"))
    print(f"\nbudget {size(decision.budget_bytes)} per rank; margin {percent(decision.margin, decimals=0)}")
    print(f"decision: {decision.reason}")
    print("(predicted by the cost model with the hardware profile's θ; not a measurement)")
    return 0
