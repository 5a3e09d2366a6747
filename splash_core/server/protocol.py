"""Request bodies of the endpoints clients use, read into one :class:`Call`, and the errors they get.

OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` (the field names and defaults of
OpenAI's API, with vLLM's and SGLang's extensions ``top_k``, ``ignore_eos``, ``stop_token_ids``)
and SGLang's native ``/generate`` (``text`` or ``input_ids``, ``sampling_params``). Every bad
value is an :class:`ApiError`: HTTP 400 with an OpenAI-style error object whose ``param`` names
the field (``max_tokens``, ``messages[1].content``, ``sampling_params.top_p``...). Fields a
client may send that SPLASH cannot honour (``n`` > 1, ``logprobs``, penalties, ``echo``, tools)
are refused by name rather than silently ignored; fields nobody here reads are ignored, as
OpenAI-compatible servers do.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Callable

from ..runtime.sampling import SamplingParams

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
GENERATE_MAX_NEW_TOKENS = 128  # SGLang's default for /generate


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


@dataclasses.dataclass(frozen=True)
class Call:
    """One generation request as the front end runs it."""

    api: str  # completions, chat or generate
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()  # stop strings (cut from the text, not sent)
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    model: str = ""


_UNSUPPORTED = {  # field -> values that mean "not asked for"
    "n": (None, 1), "best_of": (None, 1), "logprobs": (None, False, 0), "top_logprobs": (None, 0),
    "echo": (None, False), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}), "suffix": (None, ""), "tools": (None, []), "functions": (None, []),
    "return_logprob": (None, False), "lora_path": (None, ""),
}


def completion(body: dict, served: Served) -> Call:
    """``/v1/completions``: ``prompt`` is a string or token ids (one prompt per request)."""
    prompt = _one_prompt(body, "prompt")
    ids = _text_or_ids(prompt, "prompt", served, special=True)
    return _call("completions", body, ids, served, default_max=COMPLETION_MAX_TOKENS)


def chat(body: dict, served: Served) -> Call:
    """``/v1/chat/completions``: ``messages`` through the tokenizer's chat template."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "expected a non-empty list of {role, content} messages", "missing_required_parameter"
                  if messages is None else None)
    if served.tokenizer is None or not served.tokenizer.chat_template:
        raise bad("messages", f"model {served.model!r} has no chat template (tokenizer_config.json); use /v1/completions")
    plain = [_message(m, i) for i, m in enumerate(messages)]
    text = served.tokenizer.render_chat(plain, add_generation_prompt=True)
    ids = served.tokenizer.encode(text, add_special_tokens=False)  # the template writes the special tokens
    _check_ids(ids, "messages", served)
    default = served.context_length - len(ids)
    newer = body.get("max_completion_tokens") is not None  # OpenAI's newer name for max_tokens
    return _call("chat", body, ids, served, default_max=default,
                 max_field="max_completion_tokens" if newer else "max_tokens")


def generate(body: dict, served: Served) -> Call:
    """SGLang's ``/generate``: ``text`` or ``input_ids``, ``sampling_params``, ``stream``."""
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text == has_ids:
        raise bad("text", "give exactly one of text or input_ids", "missing_required_parameter" if not has_text else None)
    if has_text:
        ids = _text_or_ids(_one_prompt(body, "text"), "text", served, special=True)
    else:
        ids = _text_or_ids(_one_prompt(body, "input_ids"), "input_ids", served, special=True)
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise bad("sampling_params", f"expected an object (got {type(params).__name__})")
    nested = {**params, "stream": body.get("stream", False)}
    if "max_new_tokens" in params:
        nested["max_tokens"] = params["max_new_tokens"]
    if "sampling_seed" in params:
        nested["seed"] = params["sampling_seed"]
    call = _call("generate", nested, ids, served, default_max=GENERATE_MAX_NEW_TOKENS, prefix="sampling_params.",
                 default_temperature=1.0)
    _refuse_unsupported(body, "")
    return call


def _call(api: str, body: dict, ids: list[int], served: Served, *, default_max: int, max_field: str = "max_tokens",
          prefix: str = "", default_temperature: float = 1.0) -> Call:
    _refuse_unsupported(body, prefix)
    model = body.get("model")
    if api != "generate" and model is not None and model != served.model:
        raise ApiError(400, f"model: {model!r} is not served here (serving {served.model!r})", "model",
                       code="model_not_found")
    field = prefix + ("max_new_tokens" if prefix else max_field)
    max_new = _number(body, max_field, int, field, default_max)
    if max_new < 1:
        raise bad(field, f"must be >= 1 (got {max_new})")
    total = len(ids) + max_new
    if len(ids) >= served.context_length:
        raise bad(_prompt_field(api), f"the prompt has {len(ids)} tokens; this model's context length is "
                                      f"{served.context_length} tokens", "context_length_exceeded")
    if total > served.context_length:
        raise bad(field, f"{len(ids)} prompt + {max_new} output tokens exceed this model's context length of "
                         f"{served.context_length} tokens", "context_length_exceeded")
    why = served.refusal(len(ids), max_new)
    if why:
        raise bad(field if max_new > 1 else _prompt_field(api), f"this request can never fit the KV pool in any "
                                                                  f"layout: {why}", "kv_capacity_exceeded")
    sampling = _sampling(body, prefix, served, default_temperature)
    stop = body.get("stop")
    stops = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise bad(prefix + "stop", f"expected a non-empty string or a list of them (got {stop!r})")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", f"expected true or false (got {stream!r})")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad("stream_options", f"expected an object (got {options!r})")
    return Call(api, tuple(ids), max_new, sampling, tuple(stops), stream, bool(options.get("include_usage")),
                served.model)


def _sampling(body: dict, prefix: str, served: Served, default_temperature: float) -> SamplingParams:
    temperature = _number(body, "temperature", float, prefix + "temperature", default_temperature)
    top_p = _number(body, "top_p", float, prefix + "top_p", 1.0)
    top_k = _number(body, "top_k", int, prefix + "top_k", 0)
    seed = _number(body, "seed", int, prefix + "seed", None)
    if top_k == -1:  # vLLM's and SGLang's "all tokens"
        top_k = 0
    for name, ok, want in (("temperature", temperature >= 0, ">= 0"), ("top_p", 0 < top_p <= 1, "in (0, 1]"),
                           ("top_k", top_k >= 0, ">= 0 or -1")):
        if not ok:
            raise bad(prefix + name, f"must be {want} (got {body.get(name)})")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and 0 <= t < served.vocab_size for t in stop_ids):
        raise bad(prefix + "stop_token_ids", f"expected token ids in [0, {served.vocab_size}) (got {stop_ids!r})")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad(prefix + "ignore_eos", f"expected true or false (got {ignore_eos!r})")
    eos = () if ignore_eos or served.tokenizer is None else tuple(served.tokenizer.eos_token_ids)
    # no seed: a fresh one, so unseeded sampled requests differ as clients expect
    return SamplingParams(temperature, top_k, top_p, secrets.randbits(62) if seed is None else seed,
                          tuple(dict.fromkeys(tuple(stop_ids) + eos)), seed_alone=True)


def _number(body: dict, key: str, kind: type, field: str, default):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise bad(field, f"expected {'an integer' if kind is int else 'a number'} (got {value!r})")
    return kind(value)


def _refuse_unsupported(body: dict, prefix: str) -> None:
    for key, fine in _UNSUPPORTED.items():
        if key in body and body[key] not in fine:
            raise bad(prefix + key, f"not supported by this server (got {body[key]!r})", "unsupported_parameter")


def _one_prompt(body: dict, key: str):
    value = body.get(key)
    if value is None:
        raise bad(key, "missing", "missing_required_parameter")
    batch = isinstance(value, list) and value and isinstance(value[0], (str, list))
    if batch:
        if len(value) != 1:
            raise bad(key, f"one prompt per request (got {len(value)})")
        value = value[0]
    return value


def _text_or_ids(value, field: str, served: Served, special: bool) -> list[int]:
    if isinstance(value, str):
        if served.tokenizer is None:
            raise bad(field, f"model {served.model!r} has no tokenizer: send token ids")
        ids = served.tokenizer.encode(value, add_special_tokens=special)
    elif isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        ids = list(value)
    else:
        raise bad(field, f"expected a string or a list of token ids (got {type(value).__name__})")
    _check_ids(ids, field, served)
    return ids


def _check_ids(ids: list[int], field: str, served: Served) -> None:
    if not ids:
        raise bad(field, "the prompt is empty")
    wrong = [t for t in ids if not 0 <= t < served.vocab_size]
    if wrong:
        raise bad(field, f"token ids must be in [0, {served.vocab_size}) (got {wrong[:3]})")


def _message(m, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad(where, f"expected an object with role and content (got {type(m).__name__})")
    role, content = m.get("role"), m.get("content")
    if role not in ("system", "user", "assistant", "developer"):
        raise bad(f"{where}.role", f"expected system, developer, user or assistant (got {role!r})")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"{where}.content[{k}]", "only text parts are supported")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise bad(f"{where}.content", f"expected a string (got {type(content).__name__})")
    return {"role": "system" if role == "developer" else role, "content": content}


def _prompt_field(api: str) -> str:
    return {"completions": "prompt", "chat": "messages"}.get(api, "text")
