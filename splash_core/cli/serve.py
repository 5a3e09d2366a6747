"""``splash serve``: an OpenAI-compatible HTTP server (and SGLang's native ``/generate``) on T ranks,
the scheduler switching the attention layout live while requests come and go.

With no model or deployment it serves the CPU main job's tiny checkpoint (deployment
``cpu-tiny``), as ``splash run`` does. Everything that can be checked before a rank starts is:
the checkpoint against its config.json, the KV format, the policy, the KV pool, the port. See
:mod:`splash_core.server.launcher` for where HTTP lives, and ``docs/serving.md``.
"""

from __future__ import annotations

import dataclasses
import os

from .args import UsageError, add_switch_options, at_least, positive_float
from .engine_job import deployment_for

DEFAULT_DEPLOYMENT = "cpu-tiny"
DEFAULT_CONTEXT = 4096  # for a deployment whose model has no checkpoint (seeded weights): nothing says more


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve an OpenAI-compatible API with live layout switching",
                       description="Start the group, load the model and serve OpenAI's /v1/completions and "
                                   "/v1/chat/completions, SGLang's /generate, /health and Prometheus /metrics "
                                   "until SIGTERM or Ctrl-C. With no arguments: the tiny checkpoint of "
                                   f"{DEFAULT_DEPLOYMENT} on two CPU ranks.")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="a Hugging Face checkpoint folder (DeepseekV2/V3ForCausalLM) to serve instead of the "
                        "deployment's model")
    p.add_argument("--deployment", default=DEFAULT_DEPLOYMENT,
                   help=f"deployment profile: name or path (default {DEFAULT_DEPLOYMENT})")
    p.add_argument("--T", type=at_least(1), default=None, help="ranks in the group (default: the deployment's)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=at_least(0), default=30000, help="port (default 30000, as SGLang)")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY (not on /health, /metrics)")
    p.add_argument("--served-model-name", default=None,
                   help="the model's name in the API (default: the checkpoint folder, as SGLang and vLLM)")
    p.add_argument("--max-running", type=at_least(1), default=64, help="requests running at once (default 64)")
    p.add_argument("--context-length", type=at_least(2), default=None,
                   help="longest prompt + output (default: config.json's max_position_embeddings)")
    p.add_argument("--kv-pages", type=at_least(1), default=None,
                   help="KV pages per layer and rank (default: the memory budget, capped at --max-running "
                        "requests of --context-length)")
    p.add_argument("--policy", default="splash",
                   help="splash (the scheduler decides every step), a fixed layout TP|CP|DP|DOP, "
                        "or script:TP,DP,...[:STEPS] (forced switches)")
    p.add_argument("--prefill-chunk", type=at_least(1), default=8192, help="prefill rows per owner rank per step")
    add_switch_options(p)
    p.add_argument("--grace-period", type=positive_float, default=30.0,
                   help="seconds requests in flight get to finish after SIGTERM/SIGINT (default 30)")
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="collective timeout in seconds: a rank that hangs longer stops the server "
                        "(default: the deployment's collective_timeout_s)")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                   help="the HTTP server's log level (default info: one line per request)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine.launch import under_torchrun
    from ..engine.policy import make_policy
    from ..model.kv_format import kv_format_problem
    from ..server.launcher import ServerConfig, listen, run_server

    deployment = deployment_for(args)
    try:
        policy = make_policy(args.policy, deployment)
    except ValueError as exc:
        raise UsageError(f"--policy: {exc}") from None
    problem = kv_format_problem(deployment.model)
    if problem:
        raise UsageError(f"deployment {deployment.name!r}: model.kv_cache: {problem}")
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) != deployment.T:
        raise UsageError(f"torchrun started {os.environ['WORLD_SIZE']} processes, but deployment "
                         f"{deployment.name!r} has T = {deployment.T}: start one process per rank "
                         f"(--nproc-per-node {deployment.T})")
    served, info, kv_pages = _served(args, deployment, policy)
    job = dict(deployment=args.deployment, model=args.model, T=args.T, policy=args.policy, kv_pages=kv_pages,
               max_running=args.max_running, prefill_chunk=args.prefill_chunk, switch_mode=args.switch_mode,
               precopy_steps=args.precopy_steps)
    config = ServerConfig(args.host, args.port, served, info, job, deployment.backend, deployment.T,
                          args.timeout or deployment.collective_timeout_s, api_key=args.api_key,
                          grace_s=args.grace_period, log_level=args.log_level)
    if under_torchrun() and int(os.environ["RANK"]) != 0:  # rank 0 hosts HTTP; the others only compute
        from ..engine.live import LiveJob, serve_live
        from ..runtime.group import from_env, shutdown

        ctx = from_env(config.backend, config.collective_timeout_s)
        try:
            serve_live(ctx, LiveJob(conn=None, **job))
        finally:
            shutdown(ctx)
        return 0
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise UsageError(f"--port {args.port}: cannot listen on {args.host}:{args.port}: "
                         f"{exc.strerror or exc}") from None
    config = dataclasses.replace(config, port=sock.getsockname()[1])  # with --port 0, the port chosen
    return run_server(config, sock)


def _served(args, deployment, policy):
    """(what requests are checked against, what /server_info reports, KV pages per layer and rank)."""
    import time

    import numpy as np

    from ..checkpoint.tiny import ensure_written
    from ..checkpoint.tokenizer import Tokenizer
    from ..engine.admission import Admission, plan_capacity
    from ..engine.requests import Request
    from ..profiles.checkpoint_config import read_config
    from ..profiles.workload import RequestSpec
    from ..server.protocol import Served

    folder = ensure_written(deployment.model)
    tokenizer = Tokenizer(folder) if folder and os.path.isfile(os.path.join(folder, "tokenizer.json")) else None
    context = args.context_length
    if context is None:
        context = (read_config(folder)[1].get("max_position_embeddings") if folder else None) or DEFAULT_CONTEXT
    try:
        capacity = plan_capacity(deployment, args.max_running, [context] * args.max_running, args.kv_pages)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    admission = Admission(capacity, args.max_running, policy.layouts)

    def refusal(prompt_tokens: int, max_new_tokens: int) -> str:
        return admission.refusal(Request(RequestSpec(0, prompt_tokens, max_new_tokens), np.zeros(0, np.int64)))

    why = refusal(1, 1)
    if why:
        raise UsageError(f"--kv-pages: the KV pool cannot hold even a 2-token request: {why}")
    name = args.served_model_name or args.model or folder or deployment.model.name
    served = Served(str(name), deployment.model.vocab_size, int(context), tokenizer, refusal)
    info = {"deployment": deployment.name, "backend": deployment.backend, "T": deployment.T,
            "policy": policy.name, "layout": str(policy.initial), "model_path": folder,
            "tokenizer_path": folder if tokenizer is not None else None, "kv_pages": capacity.pages,
            "page_size": deployment.page_size, "max_running": args.max_running,
            "prefill_chunk": args.prefill_chunk, "started": int(time.time())}
    return served, info, capacity.pages
