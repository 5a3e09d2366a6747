"""``splash sweep``: the paper's fixed-layout sweeps predicted by the cost model.

    splash sweep --deployment h200-x8-deepseek-v3.2 --batch 16 --inputs 1k,4k,16k,32k,64k,128k,256k
    splash sweep --deployment h200-x8-deepseek-v3.2 --batches 1,4,8,16,32,64,128,256 --input 32k
    splash sweep --deployment h200-x8-deepseek-v3.2 --paper      # every position of Table 6, beside it

Each position is B requests of L input tokens at concurrency B; every layout's total
throughput B(L + output)/T_batch is predicted, the best marked (:mod:`splash_core.studies.sweep`).
``--paper`` takes the positions of the paper's table for the deployment's platform and model
and prints the paper's values and the agreement beside the predictions; ``--out`` writes the
predictions as a ``fixed_layout_sweep`` result (source ``model``) for ``splash report``."""

from __future__ import annotations

import dataclasses

from .. import results
from ..layouts import LAYOUTS
from ..profiles import load
from ..studies.sweep import MODES, NOTE, predict
from ..studies.sweep_paper import TABLES, agreement, paper_positions, regret, repeat_gap, repeats
from .args import UsageError, figure_path, writable_dir
from .output import print_json, table
from .plan import parse_tokens


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="predict the paper's fixed-layout sweeps (throughput per layout)")
    p.add_argument("--deployment", required=True, help="deployment profile: name or path to a .yaml")
    p.add_argument("--batch", type=int, help="B for an input-length sweep (with --inputs)")
    p.add_argument("--inputs", help="input lengths of an input-length sweep, e.g. 1k,4k,16k (k = 1024)")
    p.add_argument("--batches", help="batch sizes of a batch-size sweep, e.g. 1,4,8,16 (with --input)")
    p.add_argument("--input", help="input length of a batch-size sweep, e.g. 64k")
    p.add_argument("--paper", action="store_true",
                   help="every position of the paper's table for this deployment, with the paper's values")
    p.add_argument("--output", default="1024", help="output tokens per request (default 1024, the paper's)")
    p.add_argument("--mode", choices=MODES, default="disaggregated",
                   help="disaggregated: prefill here, decode on a fixed DP-attention group (the paper's "
                        "protocol, default); colocated: prefill and decode here in the layout under test")
    p.add_argument("--prefill-chunk", type=int, help="prefill tokens per step over the group "
                                                     "(default: the deployment's disaggregation.prefill_chunk)")
    p.add_argument("--reference", default="bench/reference", help="folder of the paper's CSVs (for --paper)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="PNG", type=figure_path,
                   help="draw throughput per layout, best starred (like Figures 4, 8, 10)")
    p.add_argument("--out", metavar="DIR", type=writable_dir,
                   help="write a fixed_layout_sweep result (source model) under DIR/<platform>x<T>/")
    p.set_defaults(func=run)


@dataclasses.dataclass(frozen=True)
class _Sweep:
    label: str
    axis: str  # "input_tokens" or "batch"
    positions: tuple[tuple[int, int], ...]  # (batch, input tokens)
    paper: tuple = ()  # PaperPosition per position, with --paper


def _sweeps(args, deployment) -> list[_Sweep]:
    given = [args.inputs is not None or args.batch is not None, args.batches is not None or args.input is not None,
             args.paper]
    if sum(given) != 1:
        raise UsageError("give one of --batch with --inputs, --batches with --input, or --paper")
    if args.paper:
        return _paper_sweeps(args, deployment)
    if given[0]:
        return [_input_sweep(args)]
    return [_batch_sweep(args)]


def _paper_sweeps(args, deployment) -> list[_Sweep]:
    """Every sweep of the paper's table for the deployment's platform and model."""
    platform = deployment.hardware.platform
    found = paper_positions(args.reference, platform, deployment.model.name)
    if not found:
        raise UsageError(f"the paper has no fixed-layout sweep of model {deployment.model.name!r} on "
                         f"platform {platform!r} (it has {', '.join(f'{k} ({v})' for k, v in TABLES.items())})")
    out: dict[str, list] = {}
    for p in found:
        out.setdefault(p.sweep, []).append(p)
    return [_Sweep(label, "batch" if len({p.batch for p in ps}) > 1 else "input_tokens",
                   tuple((p.batch, p.input_tokens) for p in ps), tuple(ps)) for label, ps in out.items()]


def _input_sweep(args) -> _Sweep:
    if args.inputs is None or args.batch is None:
        raise UsageError("an input-length sweep needs both --batch and --inputs")
    if args.batch < 1:
        raise UsageError(f"--batch must be >= 1 (got {args.batch})")
    inputs = _tokens(args.inputs, "--inputs")
    return _Sweep(f"Input-length sweep, B = {args.batch}", "input_tokens", tuple((args.batch, L) for L in inputs))


def _batch_sweep(args) -> _Sweep:
    if args.batches is None or args.input is None:
        raise UsageError("a batch-size sweep needs both --batches and --input")
    L = parse_tokens(args.input)
    batches = []
    for text in args.batches.split(","):
        if not text.strip().isdigit() or int(text) < 1:
            raise UsageError(f"bad --batches entry {text.strip()!r}: expected whole numbers >= 1, e.g. 1,4,16")
        batches.append(int(text))
    return _Sweep(f"Batch-size sweep, {L // 1024 if L % 1024 == 0 else L}{'K' if L % 1024 == 0 else ''} input",
                  "batch", tuple((B, L) for B in batches))


def _tokens(text: str, flag: str) -> list[int]:
    values = [parse_tokens(t) for t in text.split(",") if t.strip()]
    if not values or min(values) < 1:
        raise UsageError(f"{flag} needs input lengths >= 1, e.g. 1k,4k,16k")
    return values


def run(args) -> int:
    deployment = load("deployment", args.deployment)
    sweeps = _sweeps(args, deployment)
    output = parse_tokens(args.output)
    if output < 1:
        raise UsageError(f"--output must be >= 1 (got {args.output})")
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        raise UsageError(f"--prefill-chunk must be >= 1 (got {args.prefill_chunk})")
    predicted = [[predict(deployment, B, L, output, mode=args.mode, prefill_chunk=args.prefill_chunk)
                  for B, L in s.positions] for s in sweeps]
    doc = _document(deployment, args, sweeps, predicted, output)
    if args.plot:
        plot(doc, args.plot)
        doc["plot"] = args.plot
    if args.out:
        doc["written"] = str(write(doc, deployment, args.out))
    if args.json:
        print_json(doc)
        return 0
    _print(doc)
    return 0


def _document(deployment, args, sweeps, predicted, output: int) -> dict:
    out = {"deployment": deployment.name, "hardware": deployment.hardware.name, "model": deployment.model.name,
           "T": deployment.T, "mode": args.mode, "output_tokens": output, "note": NOTE, "sweeps": []}
    pairs_all = []
    for s, preds in zip(sweeps, predicted):
        positions, pairs = [], []
        for i, pp in enumerate(preds):
            row = {"batch": pp.batch, "input_tokens": pp.input_tokens, "best": pp.best,
                   "layouts": {str(p.layout): {"tokens_per_s": p.tokens_per_s, "total_s": p.total_s,
                                               "prefill_s": p.prefill_s, "most_resident": p.most_resident,
                                               "note": p.note} for p in pp.layouts}}
            if s.paper:
                paper = s.paper[i]
                row["paper"] = {str(l): v for l, v in paper.tokens_per_s.items()}
                row["paper_best"] = paper.best
                pairs.append((paper, {p.layout: p.tokens_per_s for p in pp.layouts}, pp.best))
            positions.append(row)
        entry = {"label": s.label, "axis": s.axis, "positions": positions}
        if pairs:
            entry["agreement"] = agreement(pairs).summary()
            pairs_all += pairs
        out["sweeps"].append(entry)
    if pairs_all:
        out["paper_table"] = TABLES.get(deployment.hardware.platform, "")
        out["agreement"] = agreement(pairs_all).summary()
        out["regret"] = regret((paper, best) for paper, _, best in pairs_all).summary()
        out["repeats"] = _repeats(pairs_all)
    return out


def _repeats(pairs) -> list[dict]:
    """The positions the paper measured twice: both measurements, their largest gap, and the
    pick's time over each measurement's best (its regret under either)."""
    picks = {id(paper): best for paper, _, best in pairs}
    out = []
    for a, b in repeats(paper for paper, _, _ in pairs):
        pick = picks[id(a)]
        out.append({"batch": a.batch, "input_tokens": a.input_tokens, "sweeps": [a.sweep, b.sweep],
                    "paper_best": [a.best, b.best], "largest_gap": repeat_gap(a, b), "pick": pick,
                    "pick_over_best": [regret([(m, picks[id(m)])]).picks_over_oracle for m in (a, b)]})
    return out


def _print(doc: dict) -> None:
    print(f"{doc['deployment']} (hardware {doc['hardware']}, T = {doc['T']}), {doc['mode']}, "
          f"{doc['output_tokens']:,} output tokens per request")
    for s in doc["sweeps"]:
        paper = "paper" in s["positions"][0]
        headers = ["batch" if s["axis"] == "batch" else "input", *map(str, LAYOUTS), "best"]
        if paper:
            headers += ["paper best", "agree"]
        rows = []
        for p in s["positions"]:
            x = f"{p['batch']:,}" if s["axis"] == "batch" else f"{p['input_tokens']:,}"
            cells = []
            for l in map(str, LAYOUTS):
                v = p["layouts"][l]["tokens_per_s"]
                text = "-" if v is None else f"{v:,.0f}"
                if paper:
                    ref = p["paper"][l]
                    text += f" ({ref:,.0f})" if v is None else f" ({ref:,.0f}, {(v - ref) / ref:+.0%})"
                cells.append(text)
            row = [x, *cells, str(p["best"] or "-")]
            if paper:
                row += [str(p["paper_best"]), "yes" if p["best"] is p["paper_best"] else "no"]
            rows.append(row)
        print(f"\n{s['label']}: predicted total tokens/s" + (" (paper, error)" if paper else ""))
        print(table(rows, headers, align="l" + "r" * len(LAYOUTS) + "lll"))
        if "agreement" in s:
            a = s["agreement"]
            print(f"best layout agrees at {a['agreeing']}/{a['positions']}; "
                  f"{a['within_25_pct']:.0%} of throughputs within 25%")
    if "agreement" in doc:
        a, r = doc["agreement"], doc["regret"]
        print(f"\nagainst the paper's {doc['paper_table']}: best layout agrees at {a['agreeing']}/{a['positions']} "
              f"positions ({a['fraction']:.0%}); median |error| {a['median_abs_error']:.0%}, "
              f"{a['within_25_pct']:.0%} of throughputs within 25%")
        print(f"regret, scored by the paper's throughputs: {r['strict']}/{r['positions']} picks are the paper's best, "
              f"{r['within_ties']} within {r['tie_margin']:.0%} of it; the picks take {r['picks_over_oracle']:.3f}x the "
              f"oracle's time (the paper's best everywhere) and {r['picks_over_best_fixed']:.3f}x that of the best "
              f"fixed layout, {r['best_fixed']} ({r['best_fixed_over_oracle']:.3f}x the oracle's)")
        _print_repeats(doc["repeats"])
    print(f"({doc['note']})")


def _print_repeats(items: list[dict]) -> None:
    if not items:
        return
    print("\npositions the paper measured twice (its own repeat noise):")
    rows = [[f"{r['batch']:,}", f"{r['input_tokens']:,}", " / ".join(map(str, r["paper_best"])),
             f"{r['largest_gap']:.1%}", str(r["pick"] or "-"), " / ".join(f"{v:.3f}x" for v in r["pick_over_best"])]
            for r in items]
    print(table(rows, ["batch", "input", "paper best (each)", "largest gap", "pick", "pick / best (each)"],
                align="rrlrlr"))


def write(doc: dict, deployment, root: str):
    """The predictions as a ``fixed_layout_sweep`` result of source ``model``."""
    points = []
    for s in doc["sweeps"]:
        for p in s["positions"]:
            for l in map(str, LAYOUTS):
                v = p["layouts"][l]["tokens_per_s"]
                if v is not None:
                    points.append({"sweep": s["label"], "layout": l, "batch": p["batch"],
                                   "input_tokens": p["input_tokens"], "tokens_per_s": v})
    if not points:
        raise UsageError("no layout fits any position: nothing to write")
    samples = [dict(pt, total_s=p["layouts"][pt["layout"]]["total_s"]) for pt, p in
               ((pt, _position(doc, pt)) for pt in points)]
    hw = deployment.hardware
    data = results.make_result(
        benchmark="fixed_layout_sweep", platform=f"{hw.platform}x{deployment.T}", backend="cost model",
        model=deployment.model.name, T=deployment.T, dtype=f"{deployment.model.weight_dtype} weights",
        samples=samples, summary={"output_tokens": doc["output_tokens"], "points": points}, source="model",
        machine=f"modelled for {deployment.T}x {hw.name} ({hw.device})", extra={"variant": doc["mode"]},
        notes=f"{doc['note']}; deployment {deployment.name} (hardware {hw.name}), {doc['mode']} protocol")
    return results.write_result(data, root, name=f"fixed_layout_sweep-model-{doc['mode']}")


def _position(doc: dict, point: dict) -> dict:
    for s in doc["sweeps"]:
        if s["label"] == point["sweep"]:
            for p in s["positions"]:
                if (p["batch"], p["input_tokens"]) == (point["batch"], point["input_tokens"]):
                    return p
    raise KeyError(point)


def plot(doc: dict, path: str) -> None:
    """The predictions drawn as the report draws sweeps (one panel per sweep, best starred)."""
    from ..report.sweeps import Sweep, plot_sweeps

    groups = []
    for s in doc["sweeps"]:
        positions = tuple((p["batch"], p["input_tokens"]) for p in s["positions"])
        values = {(l, p["batch"], p["input_tokens"]): p["layouts"][l]["tokens_per_s"] for p in s["positions"]
                  for l in map(str, LAYOUTS) if p["layouts"][l]["tokens_per_s"] is not None}
        fixed = positions[0][1] if s["axis"] == "batch" else positions[0][0]
        groups.append(Sweep(s["label"], s["axis"], fixed, positions, values))
    plot_sweeps(groups, f"{doc['model']}, T = {doc['T']} — {doc['deployment']} ({doc['mode']}): predicted by the "
                        "cost model, not measured", path)
