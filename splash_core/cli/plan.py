"""``splash plan``: the manifest of one layout switch, summarised per state, with Eq 5's peak."""

from __future__ import annotations

import numpy as np

from .. import profiles
from ..layouts import Layout
from ..planning.manifest import plan_switch
from ..planning.ownership import Batch, Request
from .args import UsageError, at_least, non_negative_float, positive_float
from .output import GIB, MIB, print_json, table


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="plan a layout switch: primitives and bytes per state, Eq 5 peak")
    p.add_argument("--from", dest="src", required=True, metavar="LAYOUT", help="TP, CP, DP or DOP")
    p.add_argument("--to", dest="dst", required=True, metavar="LAYOUT", help="TP, CP, DP or DOP")
    p.add_argument("--model", required=True, help="model profile name or path")
    p.add_argument("--T", type=at_least(1), required=True, help="ranks in the group")
    p.add_argument("--batch", type=at_least(1), required=True, help="running requests B (owners round-robin)")
    p.add_argument("--context", required=True,
                   help="tokens per request: one value for all (e.g. 131072 or 128k) or B comma-separated values")
    p.add_argument("--page-size", type=at_least(1), default=64, help="tokens per KV page (default 64)")
    p.add_argument("--layers", type=at_least(1), help="plan only the first N layers (default: all)")
    p.add_argument("--memory-gib", type=positive_float, help="per-rank budget for attention state H_r: check Eq 5 against it")
    p.add_argument("--reserve-gib", type=non_negative_float, default=0.0, help="R_r of Eq 5, GiB (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


# Bounds on what the planners materialise, so a typo cannot ask for hundreds of GiB: answers within
# them are exact, beyond them the command refuses in one line. No deployment's step holds more.
MAX_REQUESTS = 1 << 17  # requests in one batch (the scheduler's per-request arrays: ~1 KiB each)
MAX_TOKENS = 1 << 40  # tokens of one request (far past any model's context; sums stay within int64)
MAX_PAGES = 1 << 25  # KV pages of a switch plan (its per-page key arrays: ~24 bytes each, under 1 GiB)


def check_requests_bound(count: int, flag: str) -> None:
    """UsageError when ``count`` requests exceed :data:`MAX_REQUESTS`."""
    if count > MAX_REQUESTS:
        raise UsageError(f"{flag}: {count:,} requests in one batch exceed the {MAX_REQUESTS:,} this command "
                         f"evaluates (it holds arrays per request; no deployment runs such a batch)")


def parse_tokens(text: str) -> int:
    """'131072', '128k' or '1m' (k = 1,024 tokens, as the paper counts)."""
    t = text.strip().lower()
    scale = {"k": 1 << 10, "m": 1 << 20}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        raise UsageError(f"bad token count {text!r}: expected e.g. 131072, 128k or 1m") from None
    if not (0 <= value <= MAX_TOKENS and value == int(value)):  # also nan and inf
        raise UsageError(f"bad token count {text!r}: expected a whole number from 0 to {MAX_TOKENS:,} (2^40)")
    return int(value)


def _batch(args) -> Batch:
    check_requests_bound(args.batch, "--batch")
    contexts = [parse_tokens(c) for c in args.context.split(",")]
    if len(contexts) not in (1, args.batch):
        raise UsageError(f"--context gives {len(contexts)} values for --batch {args.batch}")
    pages = sum(-(-c // args.page_size) for c in contexts) * (args.batch if len(contexts) == 1 else 1)
    if pages > MAX_PAGES:
        raise UsageError(f"--context: the batch holds {pages:,} KV pages of {args.page_size} tokens, more than the "
                         f"{MAX_PAGES:,} a switch plan lists page by page here; plan fewer or shorter requests")
    if len(contexts) == 1:
        contexts *= args.batch
    return Batch(tuple(Request(i, s, i % args.T) for i, s in enumerate(contexts)))


def run(args) -> int:
    model = profiles.load("model", args.model)
    try:
        src, dst = Layout.parse(args.src), Layout.parse(args.dst)
        layers = None if args.layers is None else range(args.layers)
        manifest = plan_switch(src, dst, _batch(args), model, args.T, args.page_size, layers=layers)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    fit = None
    if args.memory_gib is not None:
        fit = manifest.fits(args.memory_gib * GIB, args.reserve_gib * GIB)
    if args.json:
        print_json(_as_json(manifest, args, fit))
        return 0
    n_layers = len(manifest.layers)
    print(f"{src} -> {dst}: {model.name}, T = {args.T}, B = {args.batch}, page {args.page_size}, "
          f"{n_layers} layers")
    rows = [(str(r["kind"]), str(r["state"]), str(r["primitive"]), r["layers"],
             r["fetched_per_layer"].max() / MIB, r["freed_per_layer"].max() / MIB,
             r["fetched_total"].max() / MIB, r["group_total"] / MIB) for r in manifest.summary()]
    print(table(rows, ["kind", "state", "primitive", "layers", "recv MiB/layer/rank", "freed MiB/layer/rank",
                       "recv MiB/rank", "recv MiB/group"], align="llllrrrr"))
    fetched = manifest.fetched_bytes()
    print(f"\n(per-rank columns show the busiest rank)\n"
          f"total received: {fetched.max() / MIB:,.2f} MiB on the busiest rank, "
          f"{fetched.sum() / MIB:,.2f} MiB across the group")
    print(f"footprint M(a) {manifest.source.busiest / GIB:.3f} GiB -> M(b) {manifest.dest.busiest / GIB:.3f} GiB "
          f"(busiest rank); one layer in transit adds up to {manifest.delta_layer.max() / MIB:,.2f} MiB")
    print(f"Eq 5 peak (max(M(a), M(b)) + delta_layer): {manifest.peak.max() / GIB:.3f} GiB on rank "
          f"{int(np.argmax(manifest.peak))}")
    if fit is not None:
        print(fit.explain())
    return 0


def _as_json(manifest, args, fit) -> dict:
    out = {
        "from": manifest.src, "to": manifest.dst, "model": manifest.model, "T": manifest.T,
        "batch": args.batch, "page_size": manifest.page_size, "layers": len(manifest.layers),
        "states": manifest.summary(),
        "fetched_bytes_per_rank": manifest.fetched_bytes(),
        "fetched_bytes_group": int(manifest.fetched_bytes().sum()),
        "source_footprint_bytes": manifest.source.total,
        "dest_footprint_bytes": manifest.dest.total,
        "delta_layer_bytes": manifest.delta_layer,
        "eq5_peak_bytes": manifest.eq5_peak,
        "peak_bytes": manifest.peak,
    }
    if fit is not None:
        out["fit"] = {"fits": fit.fits, "budget_bytes": fit.budget_bytes, "reserve_bytes": fit.reserve_bytes,
                      "peak_bytes": fit.peak_bytes, "busiest_rank": fit.busiest_rank,
                      "explanation": fit.explain()}
    return out
