"""``splash weights``: appendix A's Eq 9 for a model: per-layer projection sizes and what a
sharded→replicated switch (TP or DOP into DP or CP) receives per rank and across the group."""

from __future__ import annotations

from .. import dtypes, profiles
from ..planning.weight_bytes import MIB, weight_report
from .args import UsageError, at_least
from .output import print_json, table

LABEL = "analytical sizes (paper appendix A, Eq 9), not measurements; quantization scales not counted"


def add_parser(sub) -> None:
    p = sub.add_parser("weights", help="attention projection sizes and sharded->replicated switch volume (Eq 9)")
    p.add_argument("--model", required=True, help="model profile name or path")
    p.add_argument("--T", type=at_least(1), required=True, help="ranks in the group")
    p.add_argument("--dtype", choices=dtypes.NAMES, help="transfer format (default: the model's weight format)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    model = profiles.load("model", args.model)
    try:
        report = weight_report(model, args.T, args.dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print_json({
            "model": report.model, "T": report.T, "dtype": report.dtype, "source": LABEL,
            "kinds": [{
                "kind": k.kind, "layers": k.layers,
                "projections": [{"name": p.name, "shape": p.shape, "bytes": p.bytes,
                                 "shard_bytes": p.shard_bytes(report.T)} for p in k.projections],
                "layer_bytes": k.layer_bytes, "shard_bytes": k.shard_bytes,
                "received_per_rank_per_layer": k.received_per_rank,
                "received_by_group_per_layer": k.received_by_group,
            } for k in report.kinds],
            "model_bytes": report.model_bytes,
            "received_per_rank": report.received_per_rank,
            "received_by_group": report.received_by_group,
            "notes": report.notes,
        })
        return 0
    print(f"{report.model}: head-indexed attention projections in {report.dtype}, T = {report.T}")
    print(f"({LABEL})\n")
    rows = [(str(k.kind), p.name, " x ".join(map(str, p.shape)), p.bytes / MIB, p.shard_bytes(report.T) / MIB)
            for k in report.kinds for p in k.projections]
    print(table(rows, ["kind", "projection", "shape", "MiB/layer", "MiB/shard"], align="lllrr"))
    print()
    rows = [(str(k.kind), k.layers, k.layer_bytes / MIB, k.shard_bytes / MIB,
             k.received_per_rank / MIB, k.received_by_group / MIB) for k in report.kinds]
    print(table(rows, ["kind", "layers", "MiB/layer", "sharded MiB/rank", "switch recv MiB/rank",
                       "switch recv MiB/group"], align="lrrrrr"))
    print("\nper layer, a sharded->replicated switch (TP/DOP -> DP/CP) receives (1 - 1/T) of it per rank.")
    print(f"all {sum(k.layers for k in report.kinds)} layers: W_A = {report.model_bytes / MIB:,.2f} MiB; "
          f"the switch receives {report.received_per_rank / MIB:,.2f} MiB per rank, "
          f"{report.received_by_group / MIB:,.2f} MiB across the group.")
    if report.notes:
        print(f"\nnotes ({report.model} profile): {report.notes}")
    return 0

