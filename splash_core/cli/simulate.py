"""``splash simulate --deployment FILE --workload FILE``: a workload served under each fixed
layout and under SPLASH, modelled with the cost model and the planner (not measured)."""

from __future__ import annotations

from ..formatting import number, size
from ..layouts import LAYOUTS
from ..profiles import load
from ..studies.simulator import ORACLE, SPLASH, simulate
from .args import at_least, figure_path
from .output import print_json, table

_COLORS = {"TP": "#1f77b4", "DP": "#2ca02c", "CP": "#d62728", "DOP": "#9467bd", SPLASH: "#ff7f0e", ORACLE: "#7f7f7f"}


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="model a workload under each fixed layout, SPLASH and the per-step oracle")
    p.add_argument("--deployment", required=True, help="deployment profile: name or path to a .yaml")
    p.add_argument("--workload", required=True, help="workload profile: name or path to a .yaml")
    p.add_argument("--prefill-chunk", type=at_least(1), default=8192,
                   help="prefill rows per step per owner rank, in every layout (default 8192)")
    p.add_argument("--decode-stride", type=at_least(1), default=32,
                   help="decode steps costed together when nothing arrives or finishes (default 32)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="PNG", type=figure_path,
                   help="draw throughput per policy and SPLASH's layout over time (.png, .svg or .pdf)")
    p.set_defaults(func=run)


def run(args) -> int:
    deployment = load("deployment", args.deployment)
    workload = load("workload", args.workload)
    sim = simulate(deployment, workload, prefill_chunk=args.prefill_chunk, decode_stride=args.decode_stride)
    best, ratio = sim.best_fixed, sim.splash_ratio
    if args.plot:
        plot(sim, args.plot)
    if args.json:
        print_json({"deployment": sim.deployment, "workload": sim.workload, "prefill_chunk": sim.prefill_chunk,
                    "results": [r.summary() for r in sim.results], "best_fixed": best.policy if best else None,
                    "splash_over_best_fixed": ratio, "oracle_over_best_fixed": sim.ratio(ORACLE),
                    "splash_phases": sim.phases(), "splash_time_over_fixed": sim.regret(),
                    "note": sim.note, "plot": args.plot})
        return 0
    print(f"{deployment.name} serving {workload.name} ({len(workload.requests())} requests, "
          f"{workload.total_tokens:,} tokens)")
    print(f"This is {sim.note}.\n")
    rows = []
    for r in sim.results:
        steps = ", ".join(f"{k} {v}" for k, v in r.layout_steps.items())
        rows.append((r.policy, r.throughput, r.total_time_s, r.steps, len(r.switches), r.switch_time_s * 1e3, steps,
                     len(r.rejected)))
    print(table(rows, ["policy", "tokens/s", "time s", "steps", "switches", "switching ms", "steps per layout",
                       "rejected"], align="lrrrrrlr"))
    splash = sim.result(SPLASH)
    for e in splash.switches:
        print(f"  step {e.step}: {e.src} -> {e.dst}, {size(e.fetched_bytes)} received over the group, "
              f"exposed {number(e.exposed_s * 1e3)} ms (blocking {number(e.blocking_s * 1e3)} ms)"
              + (f", {number(e.recapture_s * 1e3)} ms of it re-capturing decode graphs" if e.recapture_s else ""))
    if splash.lazy_captures:
        print(f"  decode graphs captured on first use after switches: {splash.lazy_captures}, "
              f"{number(splash.lazy_capture_s * 1e3)} ms")
    phases = sim.phases()
    print("\nSPLASH's phases: " + "; ".join(
        f"{p['layout']} {number(p['start_s'])}-{number(p['end_s'])} s ({p['running_at_start']} -> "
        f"{p['running_at_end']} running)" for p in phases))
    if regret := sim.regret():
        print("SPLASH's time over each fixed layout's: " + ", ".join(f"{k} {v:.3f}x" for k, v in regret.items()))
    if best is not None and ratio is not None:
        print(f"\nSPLASH / best fixed layout ({best.policy}): {ratio:.3f}x; per-step oracle / best fixed: "
              f"{sim.ratio(ORACLE):.3f}x; SPLASH spent {splash.switch_time_s * 1e3:.1f} ms of "
              f"{splash.total_time_s:.1f} s switching  (modelled)")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def plot(sim, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    names = [r.policy for r in sim.results]
    values = [r.throughput for r in sim.results]
    left.bar(names, values, color=[_COLORS.get(n, "grey") for n in names])
    left.set_ylabel("total throughput (tokens/s, modelled)")
    if sim.splash_ratio is not None:
        left.set_title(f"SPLASH / best fixed ({sim.best_fixed.policy}) = {sim.splash_ratio:.3f}x", fontsize=10)
    trace = sim.result(SPLASH).trace
    start = 0.0
    for end, layout, _ in trace:
        right.axvspan(start, end, color=_COLORS.get(layout, "grey"), alpha=0.35, lw=0)
        start = end
    right.plot([t for t, _, _ in trace], [n for _, _, n in trace], color="black", lw=1.2)
    right.set_xlabel("time (s, modelled)")
    right.set_ylabel("running requests")
    right.set_title("SPLASH: running layout (shading) and batch size", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=_COLORS[str(l)], alpha=0.35) for l in LAYOUTS]
    right.legend(handles, [str(l) for l in LAYOUTS], loc="upper right", fontsize=8)
    fig.suptitle(f"{sim.deployment} serving {sim.workload}")
    fig.text(0.01, 0.01, f"This is {sim.note}.", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
