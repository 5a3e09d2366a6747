"""``splash serve``: an OpenAI-compatible HTTP server (and SGLang's native ``/generate``) on T ranks,
the scheduler switching the attention layout live while requests come and go.

With no model or deployment it serves the CPU main job's tiny checkpoint (deployment
``cpu-tiny``), as ``splash run`` does. Everything that can be checked before a rank starts is:
the checkpoint against its config.json, the KV format, the policy, the KV pool, the port. See
:mod:`splash_core.server.launcher` for where HTTP lives, and ``docs/serving.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from .args import UsageError, add_switch_options, at_least, positive_float
from .engine_job import check_torchrun_world, deployment_for

DEFAULT_DEPLOYMENT = "cpu-tiny"
DEFAULT_CONTEXT = 4096  # for a deployment whose model has no checkpoint (seeded weights): nothing says more
DEFAULT_MAX_BODY_BYTES = 32 * 2**20  # a body beyond it is refused before it is parsed (a 10 MB prompt fits)
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve an OpenAI-compatible API with live layout switching",
                       description="Start the group, load the model and serve OpenAI's /v1/completions and "
                                   "/v1/chat/completions, SGLang's /generate, /health and Prometheus /metrics "
                                   "until SIGTERM or Ctrl-C. With no arguments: the tiny checkpoint of "
                                   f"{DEFAULT_DEPLOYMENT} on two CPU ranks.")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="a Hugging Face checkpoint folder (DeepseekV2/V3/V32, Glm4MoeLite or KimiLinear ForCausalLM) "
                        "to serve instead of the "
                        "deployment's model")
    p.add_argument("--deployment", default=DEFAULT_DEPLOYMENT,
                   help=f"deployment profile: name or path (default {DEFAULT_DEPLOYMENT})")
    p.add_argument("--T", type=at_least(1), default=None, help="ranks in the group (default: the deployment's)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=30000, help="port, 0 to 65535 (default 30000, as SGLang; 0: one "
                                                               "the OS picks)")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY (not on /health, /metrics)")
    p.add_argument("--served-model-name", default=None,
                   help="the model's name in the API (default: the checkpoint folder's name, as SGLang and vLLM)")
    p.add_argument("--chat-template", metavar="FILE", default=None,
                   help="a Jinja chat template for /v1/chat/completions instead of the checkpoint's "
                        "(chat_template.jinja, else tokenizer_config.json's chat_template)")
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
    p.add_argument("--max-body-bytes", type=at_least(1), default=DEFAULT_MAX_BODY_BYTES,
                   help=f"largest request body in bytes; a larger one gets 413 (default {DEFAULT_MAX_BODY_BYTES:,})")
    p.add_argument("--max-prompt-tokens", type=at_least(1), default=None,
                   help="longest prompt in tokens; a longer one gets 400 (default: the context length bounds it)")
    p.add_argument("--allowed-origins", type=_origins, default=(), metavar="ORIGIN[,ORIGIN...]",
                   help="CORS: the origins browsers may call the API from, e.g. https://app.example.com, "
                        "or * for any (default: none, CORS off)")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                   help="log level (default info: start and stop, every layout switch, a stats line while busy, "
                        "and one line per HTTP request)")
    p.add_argument("--log-stats-interval", type=positive_float, default=10.0, metavar="SECONDS",
                   help="seconds between stats lines (throughput, requests, KV cache, layout) while busy (default 10)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine.launch import under_torchrun

    # the port is taken before anything loads, so a port in use is one line and no wait
    sock = None if under_torchrun() and int(os.environ["RANK"]) != 0 else _listen(args.host, args.port)
    try:
        return _serve(args, sock)
    except BaseException:
        if sock is not None:
            sock.close()
        raise


def _serve(args, sock) -> int:
    from ..engine.policy import make_policy
    from ..model.kv_format import kv_format_problem
    from ..server.launcher import ServerConfig, run_server

    deployment = deployment_for(args)
    try:
        policy = make_policy(args.policy, deployment)
    except ValueError as exc:
        raise UsageError(f"--policy: {exc}") from None
    problem = kv_format_problem(deployment.model)
    if problem:
        raise UsageError(f"deployment {deployment.name!r}: model.kv_cache: {problem}")
    if not check_torchrun_world(deployment):
        return 0
    served, info, kv_pages = _served(args, deployment, policy)
    if args.max_prompt_tokens is not None and args.max_prompt_tokens >= served.context_length:
        raise UsageError(f"--max-prompt-tokens {args.max_prompt_tokens}: must be below the context length "
                         f"({served.context_length} tokens)")
    job = dict(deployment=args.deployment, model=args.model, T=args.T, policy=args.policy, kv_pages=kv_pages,
               max_running=args.max_running, prefill_chunk=args.prefill_chunk, switch_mode=args.switch_mode,
               precopy_steps=args.precopy_steps)
    config = ServerConfig(args.host, args.port, served, info, job, deployment.backend, deployment.T,
                          args.timeout or deployment.collective_timeout_s, api_key=args.api_key,
                          grace_s=args.grace_period, log_level=args.log_level,
                          stats_interval_s=args.log_stats_interval, max_body_bytes=args.max_body_bytes,
                          max_prompt_tokens=args.max_prompt_tokens, allowed_origins=args.allowed_origins)
    if sock is None:  # under torchrun, a rank but 0: rank 0 hosts HTTP; the others only compute
        from ..engine.live import LiveJob, serve_live
        from ..runtime.group import from_env, shutdown

        ctx = from_env(config.backend, config.collective_timeout_s)
        try:
            serve_live(ctx, LiveJob(conn=None, **job))
        finally:
            shutdown(ctx)
        return 0
    _log_to_stderr(args.log_level)
    config = dataclasses.replace(config, port=sock.getsockname()[1])  # with --port 0, the port chosen
    return run_server(config, sock)


def _listen(host: str, port: int):
    from ..server.launcher import listen

    try:
        return listen(host, port)
    except OSError as exc:
        raise UsageError(f"--port {port}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _log_to_stderr(level: str) -> None:
    """The server's log: lines with timestamps on stderr at ``level`` (uvicorn's loggers included)."""
    import logging

    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stderr,
                        force=True)


def _served(args, deployment, policy):
    """(what requests are checked against, what /server_info reports, KV pages per layer and rank)."""
    import time

    import numpy as np

    from ..checkpoint.generation_config import sampling_defaults
    from ..checkpoint.tiny import ensure_written
    from ..engine.admission import Admission, plan_capacity
    from ..engine.memory_plan import deployment_memory
    from ..engine.memory_plan import refusal as does_not_fit
    from ..engine.requests import Request
    from ..profiles.checkpoint_config import read_config
    from ..profiles.workload import RequestSpec
    from ..server.protocol import Served

    folder = ensure_written(deployment.model)
    tokenizer = _tokenizer(folder, args.chat_template)
    context = args.context_length
    if context is None:
        context = (read_config(folder)[1].get("max_position_embeddings") if folder else None) or DEFAULT_CONTEXT
    memory = deployment_memory(deployment, policy.layouts)
    why = does_not_fit(memory)  # the weights first, before any is loaded
    try:
        capacity = plan_capacity(deployment, args.max_running, [context] * args.max_running, args.kv_pages,
                                 policy.layouts, memory)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    why = why or does_not_fit(memory, capacity.pages * int(deployment.kv_page_bytes))
    if why:
        raise UsageError(why)
    admission = Admission(capacity, args.max_running, policy.layouts)

    def refusal(prompt_tokens: int, max_new_tokens: int) -> str:
        return admission.refusal(Request(RequestSpec(0, prompt_tokens, max_new_tokens), np.zeros(0, np.int64)))

    why = refusal(1, 1)
    if why:
        raise UsageError(f"--kv-pages: the KV pool cannot hold even a 2-token request: {why}")
    # a builtin checkpoint's cache folder carries a content hash: it is served under its builtin name
    name = args.served_model_name or deployment.model.builtin or (model_name(folder) if folder else
                                                                  deployment.model.name)
    defaults = sampling_defaults(folder) if folder else {}
    served = Served(str(name), deployment.model.vocab_size, int(context), tokenizer, refusal, defaults)
    info = {"deployment": deployment.name, "backend": deployment.backend, "T": deployment.T,
            "policy": policy.name, "layout": str(policy.initial), "model_path": folder,
            "tokenizer_path": folder if tokenizer is not None else None, "kv_pages": capacity.pages,
            "page_size": deployment.page_size, "max_running": args.max_running,
            "prefill_chunk": args.prefill_chunk, "started": int(time.time()),
            "chat_template": tokenizer.chat_template_source if tokenizer is not None else None,
            "sampling_defaults": dict(defaults)}
    return served, info, capacity.pages


def _tokenizer(folder: str | None, chat_template: str | None):
    """The checkpoint's tokenizer (None where it has none), with ``--chat-template``'s template."""
    from ..checkpoint.tokenizer import Tokenizer

    if not folder or not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        if chat_template:
            raise UsageError(f"--chat-template {chat_template}: the model has no tokenizer.json to render "
                             f"chats with")
        return None
    if chat_template is None:
        return Tokenizer(folder)
    try:
        text = Path(chat_template).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise UsageError(f"--chat-template {chat_template}: cannot read: {why}") from None
    if not text.strip():
        raise UsageError(f"--chat-template {chat_template}: the file is empty")
    return Tokenizer(folder, chat_template=text, chat_template_source=str(Path(chat_template).resolve()))


def model_name(folder: str) -> str:
    """The name a checkpoint is served under: its folder's name, or ``org/name`` for a folder of
    the Hugging Face cache (``.../models--org--name/snapshots/<commit>``)."""
    path = Path(os.path.abspath(Path(folder).expanduser()))  # "x/." and "x/" are x; a link keeps its own name
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.removeprefix("models--").replace("--", "/")
    return path.name or str(folder)


def _port(text: str) -> int:
    port = at_least(0)(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number, 0 to 65535 (got {port})")
    return port


def _origins(text: str) -> tuple[str, ...]:
    """``--allowed-origins``: ``*`` or comma-separated origins (scheme://host[:port])."""
    origins = tuple(o.strip() for o in text.split(",") if o.strip())
    if not origins:
        raise argparse.ArgumentTypeError("expected * or one or more origins such as https://app.example.com")
    for origin in origins:
        parts = urlsplit(origin)
        if origin != "*" and (parts.scheme not in ("http", "https") or not parts.netloc
                              or parts.path not in ("", "/") or parts.query or parts.fragment):
            raise argparse.ArgumentTypeError(f"{origin!r} is not an origin (scheme://host[:port], e.g. "
                                             f"https://app.example.com) nor *")
    return tuple(o.rstrip("/") for o in origins)
