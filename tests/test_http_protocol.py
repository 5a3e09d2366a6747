"""The request allow-list and the response shapes without a server (cheap): how bodies become
calls (n choices of each prompt, each with its seed; checkpoint defaults only for omitted
fields), which error a bad body gets, stop strings kept with include_stop_str_in_output, token
names that never collide, and usage counting each prompt once."""

from __future__ import annotations

import types

import pytest

from splash_core.checkpoint.tiny import ensure
from splash_core.checkpoint.tokenizer import Tokenizer
from splash_core.engine.messages import TokenLogprob
from splash_core.server import protocol
from splash_core.server.logprobs import completion, token_bytes
from splash_core.server.protocol import ApiError, Served
from splash_core.server.render import Reply
from splash_core.server.text import TextStream


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(ensure("tiny-deepseek-v3"))


def _served(tokenizer, **defaults) -> Served:
    return Served("tiny", tokenizer.vocab_size, 512, tokenizer, lambda prompt, new: "", defaults)


def _refused(parse, body, served, param: str) -> dict:
    with pytest.raises(ApiError) as caught:
        parse(body, served)
    error = caught.value.body()["error"]
    assert caught.value.status == 400 and error["param"] == param and error["message"].startswith(param + ": ")
    return error


def test_n_choices_of_each_prompt_with_a_seed_each(tokenizer):
    calls = protocol.completion({"prompt": ["a b", [5, 6, 7]], "n": 3, "seed": 40, "temperature": 0.7},
                                _served(tokenizer))
    assert [c.index for c in calls] == list(range(6)) and {c.choices for c in calls} == {3}
    assert [c.sampling.seed for c in calls] == [40, 41, 42] * 2
    assert calls[0].prompt_text == "a b" and calls[3].prompt_ids == (5, 6, 7) and calls[3].prompt_text is None
    unseeded = protocol.completion({"prompt": "a", "n": 2, "temperature": 1.0}, _served(tokenizer))
    assert unseeded[0].sampling.seed != unseeded[1].sampling.seed


def test_checkpoint_defaults_fill_only_what_a_request_omits(tokenizer):
    served = _served(tokenizer, temperature=0.6, top_p=0.9, repetition_penalty=1.1, max_tokens=7)
    (call,) = protocol.completion({"prompt": "a", "top_p": 1.0}, served)
    assert (call.sampling.temperature, call.sampling.top_p, call.sampling.repetition_penalty) == (0.6, 1.0, 1.1)
    assert call.max_new_tokens == 7
    (tiny,) = protocol.completion({"prompt": "a", "temperature": 1e-308}, served)
    assert tiny.sampling.greedy  # below 1e-5: greedy, as vLLM treats it


def test_bad_and_unknown_fields_are_named(tokenizer):
    served = _served(tokenizer)
    assert _refused(protocol.completion, {"prompt": "a", "frobnicate": 1}, served, "frobnicate")["code"] == \
        "unsupported_parameter"
    structured = {"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_object"}}
    assert _refused(protocol.chat, structured, served, "response_format")["code"] == "unsupported_parameter"
    _refused(protocol.chat, {"messages": [{"role": "user", "content": "a"}, {"role": "user"}]}, served,
             "messages[1].content")
    _refused(protocol.completion, {"prompt": "a", "max_tokens": float("nan")}, served, "max_tokens")
    _refused(protocol.completion, {"prompt": "a", "echo": True, "stream": True}, served, "echo")
    _refused(protocol.generate, {"text": "a", "sampling_params": {"top_p": 0}}, served, "sampling_params.top_p")
    assert protocol.completion({"prompt": [1, 2], "max_tokens": 0, "echo": True, "logprobs": 1}, served)[0].echo


@pytest.mark.parametrize("include, expected", [(False, "The quick "), (True, "The quick brown")])
def test_a_stop_string_is_kept_when_asked(tokenizer, include, expected):
    stream = TextStream(tokenizer, ("brown",), include_stop=include)
    sent = "".join(stream.push(t) for t in tokenizer.encode("The quick brown fox jumps", add_special_tokens=False)
                   if not stream.stopped)
    assert stream.stopped and sent == expected == stream.text


def test_every_token_has_its_own_name_and_its_bytes(tokenizer):
    names = [token_bytes(tokenizer, t) for t in range(tokenizer.vocab_size)]
    assert len({n for n, _ in names}) == tokenizer.vocab_size  # no two read as the same replacement character
    assert all(raw.decode("utf-8", "replace") == n or n.startswith("bytes:") for n, raw in names)
    text = "héllo wörld ✓"  # characters split over byte tokens
    assert b"".join(names[t][1] for t in tokenizer.encode(text, add_special_tokens=False)) == text.encode()


def test_echoed_logprobs_and_usage_of_a_reply(tokenizer):
    call = protocol.Call("completions", (0, 300, 322), 0, protocol.SamplingParams(), logprobs=1, echo=True,
                         choices=2)
    scores = [None, TokenLogprob(300, -1.0, ((300, -1.0),)), TokenLogprob(322, float("-inf"), ((5, -0.5),))]
    handle = types.SimpleNamespace(call=call, prompt_logprobs=scores, logprobs=[], token_ids=[])
    out = completion(handle, tokenizer)
    assert out["token_logprobs"] == [None, -1.0, -9999.0]  # JSON has no -inf
    assert out["top_logprobs"][0] is None and len(out["top_logprobs"][2]) == 2  # the top 1 and the chosen token
    assert Reply("cmpl", [handle, handle], n=2).usage() == {"prompt_tokens": 3, "completion_tokens": 0,
                                                            "total_tokens": 3}
    assert Reply("cmpl", [handle]).id != Reply("cmpl", [handle]).id
