"""Request bodies of the endpoints clients use, read into :class:`Call` s (one per choice), and
the errors they get.

OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` (OpenAI's field names and defaults,
with vLLM's and SGLang's extensions) and SGLang's native ``/generate``; the fields each takes are
the allow-list of :mod:`~splash_core.server.bodies`. Every bad value is an :class:`ApiError`: HTTP
400 with an OpenAI-style error object whose ``param`` names the field (``max_tokens``,
``messages[1].content``, ``sampling_params.top_p``...); a field SPLASH cannot honour, or does not
know, is refused by name (code ``unsupported_parameter``).

``n`` choices of each prompt of a request (a completion may list several prompts) are one
:class:`Call` each, with their own seed: the engine knows nothing of choices. A temperature below
:data:`GREEDY_BELOW` is greedy (as vLLM treats it): dividing logits by 1e-308 overflows.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Callable, Mapping

from pydantic import BaseModel, ValidationError

from ..runtime.sampling import SamplingParams
from .bodies import ChatBody, CompletionBody, GenerateBody, GenerateSampling

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
GREEDY_BELOW = 1e-5  # vLLM's: smaller temperatures are greedy
MAX_CHOICES = 1024  # prompts x n of one request


class ApiError(Exception):
    """An HTTP error as OpenAI's API reports one: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, f"{param}: {message}", param, code=code)


@dataclasses.dataclass(frozen=True)
class Served:
    """What a request is checked against: the model's name, vocabulary and context length, the
    tokenizer (None: token ids only) and ``refusal(prompt_tokens, max_new_tokens)``, why the KV
    pool can never hold such a request ("" if it can)."""

    model: str
    vocab_size: int
    context_length: int
    tokenizer: Any
    refusal: Callable[[int, int], str]
    # the checkpoint's sampling defaults for fields a request omits (checkpoint.generation_config:
    # temperature, top_p, top_k, min_p, repetition_penalty, max_tokens)
    defaults: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Call:
    """One choice of one prompt of a request, as the front end runs it (one engine request)."""

    api: str  # completions, chat or generate
    prompt_ids: tuple[int, ...]
    max_new_tokens: int  # 0 only with echo: the prompt is scored, nothing generated
    sampling: SamplingParams
    stop: tuple[str, ...] = ()  # stop strings (cut from the text, not sent unless include_stop)
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    model: str = ""
    logprobs: int | None = None  # None: off; k: each generated token's logprob and the top k
    echo: bool = False  # the prompt's logprobs (and its text before the output's)
    include_stop: bool = False  # a stop string that ended the text stays in it
    index: int = 0  # the choice's index in the response
    choices: int = 1  # n: the choices of its prompt (the response lists each prompt's n in a row)
    prompt_text: str | None = None  # the prompt as the client sent it (None: token ids)


def validated(model: type[BaseModel], body: dict, prefix: str = "") -> Any:
    """``body`` read into ``model``, or the :class:`ApiError` naming the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _field_error(exc.errors()[0], prefix) from None


def _field_error(error: dict, prefix: str) -> ApiError:
    param = (prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")) or "body"
    kind = error["type"]
    if kind == "extra_forbidden":
        return bad(param, "unknown field: not supported by this server (unknown fields are refused, as OpenAI's "
                          "API refuses them)", "unsupported_parameter")
    if kind == "missing":
        return bad(param, "missing", "missing_required_parameter")
    got = error.get("input")
    shown = "" if kind in ("unsupported_parameter", "stop", "content") else f" (got {repr(got)[:80]})"
    return bad(param, f"{error['msg']}{shown}", "unsupported_parameter" if kind == "unsupported_parameter" else None)


def completion(body: dict, served: Served, max_prompt_tokens: int | None = None) -> tuple[Call, ...]:
    """``/v1/completions``: ``prompt`` is a string or token ids, or a list of either."""
    b = validated(CompletionBody, body)
    check_model(b.model, served)
    prompts = _prompts(b.prompt)
    if b.best_of is not None and b.best_of != b.n:
        raise bad("best_of", f"must equal n ({b.n}): choosing the best of more is not supported (got {b.best_of})",
                  "unsupported_parameter")
    if b.echo and b.stream:
        raise bad("echo", "not supported with stream", "unsupported_parameter")
    _count_choices(len(prompts), b.n)
    max_tokens = _default(b, served, "max_tokens", COMPLETION_MAX_TOKENS)
    if max_tokens == 0 and not b.echo:
        raise bad("max_tokens", "must be >= 1 (0 only with echo, to score the prompt)")
    calls = []
    for i, prompt in enumerate(prompts):
        ids = _text_or_ids(prompt, "prompt", served, max_prompt_tokens)
        _check_fits("completions", ids, max_tokens, "max_tokens", served)
        text = prompt if isinstance(prompt, str) else None
        calls += _choices(b, "completions", ids, max_tokens, served, first=i * b.n, logprobs=b.logprobs,
                          echo=b.echo, prompt_text=text)
    return tuple(calls)


def chat(body: dict, served: Served, max_prompt_tokens: int | None = None) -> tuple[Call, ...]:
    """``/v1/chat/completions``: ``messages`` through the tokenizer's chat template."""
    b = validated(ChatBody, body)
    check_model(b.model, served)
    if b.top_logprobs and not b.logprobs:
        raise bad("top_logprobs", "needs logprobs: true")
    _count_choices(1, b.n)
    text = render_chat(b.messages, served, True, b.chat_template_kwargs)
    ids = served.tokenizer.encode(text, add_special_tokens=False)  # the template writes the special tokens
    _check_ids(ids, "messages", served, max_prompt_tokens)
    field = "max_completion_tokens" if b.max_completion_tokens is not None else "max_tokens"
    room = served.context_length - len(ids)
    asked = b.max_completion_tokens if b.max_completion_tokens is not None else b.max_tokens
    max_tokens = asked if asked is not None else min(room, int(served.defaults.get("max_tokens", room)))
    if max_tokens < 1:
        raise bad(field, f"must be >= 1 (got {max_tokens})" if asked is not None else
                  f"the prompt has {len(ids)} tokens: no room left in this model's context length of "
                  f"{served.context_length} tokens", None if asked is not None else "context_length_exceeded")
    _check_fits("chat", ids, max_tokens, field, served)
    logprobs = (b.top_logprobs or 0) if b.logprobs else None
    return tuple(_choices(b, "chat", ids, max_tokens, served, first=0, logprobs=logprobs))


def render_chat(messages: list, served: Served, add_generation_prompt: bool, kwargs: dict | None) -> str:
    """``messages`` (bodies.Message) through the tokenizer's chat template, as text."""
    if served.tokenizer is None or not served.tokenizer.chat_template:
        raise bad("messages", f"model {served.model!r} has no chat template; use /v1/completions")
    plain = [m.model_dump(exclude_none=True) for m in messages]
    for m in plain:
        m["role"] = "system" if m["role"] == "developer" else m["role"]
    try:
        return served.tokenizer.render_chat(plain, add_generation_prompt=add_generation_prompt, **(kwargs or {}))
    except Exception as exc:  # the template's own error (raise_exception), or a variable it cannot take
        raise bad("chat_template_kwargs" if kwargs else "messages",
                  f"the chat template refused these messages: {exc}") from None


def generate(body: dict, served: Served, max_prompt_tokens: int | None = None) -> tuple[Call, ...]:
    """SGLang's ``/generate``: ``text`` or ``input_ids``, ``sampling_params``, ``stream``."""
    b = validated(GenerateBody, body)
    if (b.text is None) == (b.input_ids is None):
        raise bad("text", "give exactly one of text or input_ids", "missing_required_parameter"
                  if b.text is None else None)
    field = "text" if b.text is not None else "input_ids"
    prompts = _prompts(b.text if b.text is not None else b.input_ids, field)
    if len(prompts) != 1:
        raise bad(field, f"one prompt per request (got {len(prompts)})", "unsupported_parameter")
    ids = _text_or_ids(prompts[0], field, served, max_prompt_tokens)
    params = b.sampling_params or GenerateSampling()
    max_new = _default(params, served, "max_new_tokens", params.max_new_tokens, "max_tokens")
    _check_fits("generate", ids, max_new, "sampling_params.max_new_tokens", served)
    sampling = _sampling(params, served, "sampling_params.", params.sampling_seed, min_tokens=params.min_new_tokens)
    stop = _stops(params.stop)
    return (Call("generate", tuple(ids), max_new, sampling, stop, b.stream, False, served.model,
                 include_stop=params.no_stop_trim),)


def _choices(b, api: str, ids: list[int], max_tokens: int, served: Served, *, first: int, logprobs: int | None,
             echo: bool = False, prompt_text: str | None = None) -> list[Call]:
    """The ``n`` choices of one prompt: seeded requests give choice j the seed + j."""
    include_usage = bool(b.stream_options and b.stream_options.include_usage)
    stop = _stops(b.stop)
    calls = []
    for j in range(b.n):
        seed = None if b.seed is None else b.seed + j
        sampling = _sampling(b, served, "", seed, min_tokens=b.min_tokens)
        calls.append(Call(api, tuple(ids), max_tokens, sampling, stop, b.stream, include_usage, served.model,
                          logprobs, echo, b.include_stop_str_in_output, first + j, b.n, prompt_text))
    return calls


def _sampling(b, served: Served, prefix: str, seed: int | None, min_tokens: int) -> SamplingParams:
    """The engine's sampling parameters; fields the request omits take the checkpoint's defaults."""
    given = b.model_fields_set
    value = {name: getattr(b, name) if name in given or name not in served.defaults else served.defaults[name]
             for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")}
    temperature = 1.0 if value["temperature"] is None else value["temperature"]
    stop_ids = b.stop_token_ids or []
    wrong = [t for t in stop_ids if not 0 <= t < served.vocab_size]
    if wrong:
        raise bad(prefix + "stop_token_ids", f"token ids must be in [0, {served.vocab_size}) (got {wrong[:3]})")
    eos = () if b.ignore_eos or served.tokenizer is None else tuple(served.tokenizer.eos_token_ids)
    # no seed: a fresh one, so unseeded sampled requests differ as clients expect
    return SamplingParams(0.0 if temperature < GREEDY_BELOW else temperature, max(0, value["top_k"]),
                          value["top_p"], secrets.randbits(62) if seed is None else seed,
                          tuple(dict.fromkeys(tuple(stop_ids) + eos)), seed_alone=True, min_p=value["min_p"],
                          min_tokens=min_tokens, repetition_penalty=value["repetition_penalty"],
                          presence_penalty=b.presence_penalty, frequency_penalty=b.frequency_penalty)


def _default(b, served: Served, field: str, fallback: int, default_key: str = "max_tokens") -> int:
    """A request's output budget: as given, else the checkpoint's default, else ``fallback``."""
    if field in b.model_fields_set and getattr(b, field) is not None:
        return getattr(b, field)
    return int(served.defaults.get(default_key, fallback))


def check_model(model: str | None, served: Served) -> None:
    if model is not None and model != served.model:
        raise ApiError(400, f"model: {model!r} is not served here (serving {served.model!r})", "model",
                       code="model_not_found")


def _stops(stop) -> tuple[str, ...]:
    return () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)


def _count_choices(prompts: int, n: int) -> None:
    if prompts * n > MAX_CHOICES:
        raise bad("n" if n > 1 else "prompt", f"{prompts} prompts x n = {n} choices exceed this server's limit of "
                                              f"{MAX_CHOICES} per request")


def _prompts(value, field: str = "prompt") -> list:
    """One prompt or a list of them: each a string or a list of token ids."""
    if value is None:
        raise bad(field, "missing", "missing_required_parameter")
    if isinstance(value, str) or _token_ids(value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(p, str) or _token_ids(p) for p in value):
        return value
    raise bad(field, "expected a string, a list of token ids, or a non-empty list of either")


def _token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def _text_or_ids(prompt, field: str, served: Served, max_prompt_tokens: int | None) -> list[int]:
    if isinstance(prompt, str):
        if served.tokenizer is None:
            raise bad(field, f"model {served.model!r} has no tokenizer: send token ids")
        if not prompt:
            raise bad(field, "the prompt is empty")
        ids = served.tokenizer.encode(prompt, add_special_tokens=True)
    else:
        ids = list(prompt)
    _check_ids(ids, field, served, max_prompt_tokens)
    return ids


def _check_ids(ids: list[int], field: str, served: Served, max_prompt_tokens: int | None) -> None:
    if not ids:
        raise bad(field, "the prompt is empty")
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        raise bad(field, f"the prompt has {len(ids)} tokens; this server takes at most {max_prompt_tokens} "
                         f"(--max-prompt-tokens)", "prompt_too_long")
    wrong = [t for t in ids if not 0 <= t < served.vocab_size]
    if wrong:
        raise bad(field, f"token ids must be in [0, {served.vocab_size}) (got {wrong[:3]})")


def _check_fits(api: str, ids: list[int], max_new: int, field: str, served: Served) -> None:
    """The prompt and its output fit the context length and, in some layout, the KV pool."""
    prompt_field = {"completions": "prompt", "chat": "messages"}.get(api, "text")
    if len(ids) + (max_new > 0) > served.context_length:
        raise bad(prompt_field, f"the prompt has {len(ids)} tokens; this model's context length is "
                                f"{served.context_length} tokens", "context_length_exceeded")
    if len(ids) + max_new > served.context_length:
        raise bad(field, f"{len(ids)} prompt + {max_new} output tokens exceed this model's context length of "
                         f"{served.context_length} tokens", "context_length_exceeded")
    why = served.refusal(len(ids), max(1, max_new))
    if why:
        raise bad(field if max_new > 1 else prompt_field, f"this request can never fit the KV pool in any "
                                                          f"layout: {why}", "kv_capacity_exceeded")
