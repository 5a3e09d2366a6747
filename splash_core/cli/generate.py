"""``splash generate``: continue one prompt on T ranks with the live-switching engine, and print
the text and token ids.

The model is a Hugging Face checkpoint folder (``--model PATH``) or the deployment's (default:
the CPU main job's tiny DeepSeek-V3-format checkpoint). A text prompt goes through the
checkpoint's tokenizer; ``--prompt-ids`` feeds token ids as they are. One layout (``--layout``)
or, with ``--policy``, the scheduler or a switch script, as ``splash run`` does; the tokens are
checked against the single-device reference unless ``--no-check``.
"""

from __future__ import annotations

from pathlib import Path

from .args import UsageError, at_least
from .engine_job import deployment_for, run_group
from .output import print_json

DEFAULT_DEPLOYMENT = "cpu-tiny"
SAMPLING_FLAGS = (  # flag, type, default, help
    ("--max-new-tokens", int, 32, "tokens to generate at most (default 32)"),
    ("--temperature", float, 0.0, "0 (default): greedy"),
    ("--top-k", int, 0, "sample among the k most likely tokens (0: all)"),
    ("--top-p", float, 1.0, "sample among the most likely tokens reaching p"),
    ("--seed", int, 0, "seed of the sampling draws"),
)


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt (text or token ids) on T ranks",
                       description="Generate from a prompt with the engine on T ranks: the text and the token ids, "
                                   "in one layout or with live switching (--policy).")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="a Hugging Face checkpoint folder (DeepseekV2/V3/V32, Glm4MoeLite or KimiLinear ForCausalLM; "
                        "default: the deployment's model)")
    p.add_argument("--deployment", default=DEFAULT_DEPLOYMENT,
                   help=f"deployment profile: name or path (default {DEFAULT_DEPLOYMENT})")
    p.add_argument("--T", type=at_least(1), default=None, help="ranks in the group (default: the deployment's)")
    p.add_argument("--layout", default=None, help="compute every step in this layout: TP, CP, DP or DOP")
    p.add_argument("--policy", default=None,
                   help="instead of --layout: splash (the scheduler decides every step) or script:TP,DP,...[:STEPS]")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (through the checkpoint's tokenizer)")
    prompt.add_argument("--prompt-ids", help="prompt token ids, comma-separated")
    for flag, kind, default, text in SAMPLING_FLAGS:
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument("--stop-ids", default="", help="more token ids that end the generation, comma-separated")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the checkpoint's end-of-sequence ids")
    p.add_argument("--no-check", action="store_true", help="skip the check against the single-device reference")
    p.add_argument("--timeout", type=float, default=None, help="collective timeout in seconds")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _ids(text: str, flag: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated token ids (got {text!r})") from None


def run(args) -> int:
    from ..checkpoint.tiny import ensure_written
    from ..checkpoint.tokenizer import Tokenizer
    from ..engine import Job
    from ..engine.policy import make_policy

    if args.layout and args.policy:
        raise UsageError("give --layout or --policy, not both")
    deployment = deployment_for(args)
    policy = args.policy or args.layout or str(deployment.initial_layout)
    try:
        make_policy(policy, deployment)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    model = deployment.model
    folder = ensure_written(model)
    # token ids in need no tokenizer: a folder without tokenizer.json then generates ids only
    has_tokenizer = folder and (args.prompt is not None or (Path(folder) / "tokenizer.json").is_file())
    tokenizer = Tokenizer(folder) if has_tokenizer else None
    prompt = _prompt(args, model, tokenizer)
    request = _request(args, prompt, tokenizer)
    why = _refusal(deployment, folder, request, make_policy(policy, deployment))
    if why:
        from ..engine.launch import torchrun_rank

        if torchrun_rank():
            return 2  # under torchrun every process refuses it; rank 0 says why, once
        raise UsageError(why)
    job = Job(deployment=args.deployment, model=args.model, T=args.T, policy=policy, prompts=(request,),
              check=not args.no_check)
    summary = run_group(job, "generate", args.timeout)
    if isinstance(summary, int):
        return summary
    if summary is None:  # a rank other than 0 under torchrun
        return 0
    if summary.rejected and not args.json:  # the engine ended it (a switch it needed was refused): say why
        raise UsageError(f"the request was rejected: {summary.rejected[0]['reason']}")
    out = summary.outputs[0]
    text = tokenizer.decode(out["token_ids"]) if tokenizer is not None else None
    if args.json:
        result = summary.as_dict()
        result.pop("outputs")
        print_json({"token_ids": out["token_ids"], "text": text, "prompt_token_ids": out["prompt_token_ids"],
                    "finish_reason": out["finish_reason"], **result})
    else:
        _print_generation(summary, out, text, prompt)
    return 2 if summary.rejected else 1 if summary.check_passed is False else 0


def _prompt(args, model, tokenizer) -> list[int]:
    """The prompt's token ids: ``--prompt`` through the tokenizer, or ``--prompt-ids``."""
    if args.prompt is not None:
        if tokenizer is None:
            raise UsageError(f"--prompt: model {model.name!r} has no checkpoint, so no tokenizer; give --prompt-ids")
        prompt = tokenizer.encode(args.prompt)
    else:
        prompt = _ids(args.prompt_ids, "--prompt-ids")
    bad = [t for t in prompt if not 0 <= t < model.vocab_size]
    if not prompt or bad:
        raise UsageError(f"--prompt-ids: need ids in [0, {model.vocab_size}) (got {bad[:3] or 'none'})")
    return prompt


def _refusal(deployment, folder: str | None, request, policy) -> str:
    """Why the request can never run (checked before any rank starts or allocates): longer than
    the checkpoint's context, or more KV than any layout of the policy holds (admission's rule);
    "" if it can."""
    from ..engine.preflight import JobError, check_context, check_requests
    from ..profiles.workload import RequestSpec

    try:
        check_context(folder, len(request.prompt), request.max_new_tokens)
        check_requests(deployment, [RequestSpec(0, len(request.prompt), request.max_new_tokens)], 1, policy, None,
                       "--max-new-tokens")
    except JobError as exc:
        return str(exc)
    return ""


def _request(args, prompt: list[int], tokenizer):
    """The generation request with its sampling; a bad sampling value is a usage error naming its flag."""
    from ..engine.requests import GenerationRequest
    from ..runtime.sampling import SamplingParams

    stops = _ids(args.stop_ids, "--stop-ids") + ([] if args.ignore_eos or tokenizer is None else list(tokenizer.eos_token_ids))
    try:
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed, tuple(dict.fromkeys(stops)))
        return GenerationRequest(tuple(prompt), args.max_new_tokens, sampling)
    except ValueError as exc:
        raise UsageError(f"--{str(exc).split()[0].replace('_', '-')}: {exc}") from None


def _print_generation(summary, out: dict, text: str | None, prompt: list[int]) -> None:
    from ..engine.summary import load_line

    if text is not None:
        print(text)
    print(f"token ids: {out['token_ids']}")
    print(f"{len(out['token_ids'])} tokens ({out['finish_reason']}) from a {len(prompt)}-token prompt; "
          f"{summary.deployment}, T = {summary.T}, policy {summary.policy}, steps per layout "
          + ", ".join(f"{k} {v}" for k, v in summary.layout_steps.items())
          + f", {len(summary.done_switches)} switches; {summary.elapsed_s:.2f} s")
    print(load_line(summary.load))
    if summary.check is not None:
        print(("reference check: passed, " if summary.check["passed"] else "reference check: FAILED, ")
              + summary.check["line"])
