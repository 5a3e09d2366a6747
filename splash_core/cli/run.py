"""``splash run``: the main job. Serves a workload on T ranks with the engine, the scheduler
switching the attention layout live, then prints what happened and checks the outputs against
the single-device reference.

With no arguments it runs the embedded default: the CPU reference backend, T = 2 gloo ranks,
the tiny model (deployment ``cpu-tiny``) and an RL rollout (workload ``rollout-tiny``) that
makes the scheduler switch. Under torchrun each process joins the group the environment
describes (one rank per process); otherwise the ranks are spawned here.
"""

from __future__ import annotations

from ..profiles import load
from .args import UsageError, add_switch_options, at_least, positive_float
from .engine_job import check_torchrun_world, deployment_for, run_group
from .output import print_json

DEFAULT_DEPLOYMENT, DEFAULT_WORKLOAD = "cpu-tiny", "rollout-tiny"


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="serve a workload with live layout switching (the main job)",
                       description="Serve a workload on T ranks, the scheduler switching the attention layout live; "
                                   "then print requests served, tokens/s, steps per layout, every switch, and "
                                   "whether the outputs equal the single-device reference. With no arguments: "
                                   f"{DEFAULT_DEPLOYMENT} (CPU reference backend, T = 2 gloo ranks, tiny model) "
                                   f"serving {DEFAULT_WORKLOAD} (an RL rollout).")
    p.add_argument("--deployment", default=DEFAULT_DEPLOYMENT,
                   help=f"deployment profile: name or path (default {DEFAULT_DEPLOYMENT})")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="a Hugging Face checkpoint folder (DeepseekV2/V3/V32, Glm4MoeLite or KimiLinear ForCausalLM) "
                        "to serve instead of the "
                        "deployment's model")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD,
                   help=f"workload profile: name or path (default {DEFAULT_WORKLOAD})")
    p.add_argument("--policy", default="splash",
                   help="splash (the scheduler decides every step), a fixed layout TP|CP|DP|DOP, "
                        "or script:TP,DP,...[:STEPS] (forced switches)")
    p.add_argument("--prefill-chunk", type=at_least(1), default=8192,
                   help="prefill rows per owner rank per step (default 8192, as splash simulate)")
    p.add_argument("--kv-pages", type=at_least(1), default=None,
                   help="KV pages per layer and rank (default: the budget, capped at what the workload can use)")
    add_switch_options(p)
    p.add_argument("--no-check", action="store_true", help="skip the check against the single-device reference")
    p.add_argument("--no-overlap", action="store_true",
                   help="wait for every step's tokens before planning the next (default: plan step k+1 while the "
                        "device runs step k, as SGLang's overlap scheduler)")
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="collective timeout in seconds (default: the deployment's collective_timeout_s)")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout, no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine import Job  # torch: imported only when the command runs
    from ..engine.policy import make_policy
    from ..engine.preflight import JobError, check_job
    from ..engine.summary import render

    deployment = deployment_for(args)  # with --model; its backend can run here
    workload = load("workload", args.workload)
    try:
        policy = make_policy(args.policy, deployment)
    except ValueError as exc:
        raise UsageError(str(exc)) from None  # names the policy
    if not check_torchrun_world(deployment):
        return 0
    try:
        check_job(deployment, workload, policy, args.kv_pages)  # before any rank starts
    except JobError as exc:
        raise UsageError(str(exc)) from None
    job = Job(deployment=args.deployment, model=args.model, workload=args.workload, policy=args.policy,
              prefill_chunk=args.prefill_chunk, kv_pages=args.kv_pages, switch_mode=args.switch_mode,
              precopy_steps=args.precopy_steps,
              check=not args.no_check, progress=not args.json, overlap=not args.no_overlap)
    summary = run_group(job, "run", args.timeout)
    if isinstance(summary, int):  # a rank failed
        return summary
    if summary is None:  # a rank other than 0 under torchrun: rank 0 reports
        return 0
    if args.json:
        print_json(summary.as_dict())
    else:
        print(render(summary))
    return 1 if summary.check_passed is False else 0
