"""The request bodies of ``/v1/completions``, ``/v1/chat/completions`` and SGLang's ``/generate``
as an explicit allow-list (pydantic): every field a client may send is declared here, and is
either implemented or refused by name.

The rule for fields: a field not declared here is refused with 400 (``unsupported_parameter``),
as OpenAI's own API refuses unknown fields; a field declared here that SPLASH cannot honour
(structured output, tools, ``logit_bias``, LoRA...) is accepted only at the value that means "not
asked for" and refused by name otherwise. Nothing a client asks for is silently ignored. Values
are read strictly (``"5"`` is not a number, ``2.0`` is not an integer, ``NaN``/``Infinity`` and
numbers that overflow to infinity are not finite), so every bad value is a 400 naming its field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

MAX_TOP_LOGPROBS = 20  # vLLM's limit (OpenAI's legacy completions allow 5)
MAX_N = 128  # choices per prompt
SEED_RANGE = (-(1 << 63), 1 << 64)


def _refused(*off):
    """A field SPLASH cannot honour: accepted only at one of the values ``off`` (not asked for)."""

    def check(value):
        if value not in off:
            raise PydanticCustomError("unsupported_parameter", "not supported by this server (got {got})",
                                      {"got": repr(value)[:80]})
        return value

    return Annotated[Any, BeforeValidator(check)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def _stop(value):
    """``stop``: a non-empty string or a list of them (None: none)."""
    if value is None or (isinstance(value, str) and value):
        return value
    if isinstance(value, list) and len(value) <= 16 and all(isinstance(s, str) and s for s in value):
        return value
    raise PydanticCustomError("stop", "expected a non-empty string or a list of at most 16 (got {got})",
                              {"got": repr(value)[:80]})


Stop = Annotated[Any, BeforeValidator(_stop)]
Seed = Annotated[int, Field(ge=SEED_RANGE[0], lt=SEED_RANGE[1])]


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: _refused(None, False) = None


class _OpenAiSampling(_Strict):
    """What OpenAI's two endpoints share, with vLLM's and SGLang's extensions."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # -1: all tokens (vLLM's and SGLang's spelling)
    min_p: float = Field(0.0, ge=0, le=1)
    seed: Seed | None = None
    stop: Stop = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, gt=0)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    include_stop_str_in_output: bool = False
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # the client's end user, for abuse tracking: nothing to do here
    logit_bias: _refused(None, {}) = None
    response_format: _refused(None, {"type": "text"}) = None
    guided_json: _refused(None) = None
    guided_regex: _refused(None) = None
    guided_choice: _refused(None) = None
    guided_grammar: _refused(None) = None
    structural_tag: _refused(None) = None
    priority: _refused(None, 0) = None
    lora_path: _refused(None, "") = None
    skip_special_tokens: _refused(None, True) = None


class CompletionBody(_OpenAiSampling):
    """``/v1/completions``: one prompt (text or token ids) or a list of them."""

    prompt: Any = None  # read by protocol.completion (str, [int], [str] or [[int]])
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: _refused(None, "") = None


class _TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Any  # a string or a list of text parts
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value):
        if isinstance(value, list):
            return "".join(_TextPart.model_validate(part).text for part in value)
        if not isinstance(value, str):
            raise PydanticCustomError("content", "expected a string or a list of text parts (got {got})",
                                      {"got": type(value).__name__})
        return value


class ChatBody(_OpenAiSampling):
    """``/v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    tools: _refused(None, []) = None
    tool_choice: _refused(None, "none") = None
    functions: _refused(None, []) = None
    function_call: _refused(None, "none") = None
    parallel_tool_calls: _refused(None, False) = None


class GenerateSampling(_Strict):
    """SGLang's ``sampling_params``."""

    max_new_tokens: int = Field(128, ge=1)  # SGLang's default
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    sampling_seed: Seed | None = None
    stop: Stop = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_new_tokens: int = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, gt=0)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    no_stop_trim: bool = False  # SGLang's include_stop_str_in_output
    n: _refused(None, 1) = None
    regex: _refused(None) = None
    json_schema: _refused(None) = None
    ebnf: _refused(None) = None
    structural_tag: _refused(None) = None
    skip_special_tokens: _refused(None, True) = None
    logit_bias: _refused(None, {}) = None


class GenerateBody(_Strict):
    """SGLang's ``/generate``: ``text`` or ``input_ids``, ``sampling_params``, ``stream``."""

    text: Any = None  # read by protocol.generate (a string, or a list of one)
    input_ids: Any = None
    sampling_params: GenerateSampling | None = None
    stream: bool = False
    rid: str | None = None  # SGLang's request id: the X-Request-Id header serves here
    lora_path: _refused(None, "") = None
    return_logprob: _refused(None, False) = None
    logprob_start_len: int | None = None  # only read with return_logprob
    top_logprobs_num: _refused(None, 0) = None
    return_text_in_logprobs: _refused(None, False) = None
    return_routed_experts: _refused(None, False) = None
    image_data: _refused(None, []) = None


class TokenizeBody(_Strict):
    """vLLM's ``/tokenize``: a ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages (the template has them)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeBody(_Strict):
    """vLLM's ``/detokenize``: token ids back to text."""

    model: str | None = None
    tokens: list[int]
