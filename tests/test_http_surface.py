"""The HTTP surface of ``splash serve`` as vLLM/SGLang users and their tools meet it, through one
real server on loopback (the tiny checkpoint, two CPU ranks): the ``openai`` client where it can
send the case, raw HTTP for malformed bodies.

Every field is implemented or refused by name (nothing a client asks for is silently ignored);
malformed bodies (NaN, Infinity, 1e400, lone surrogates, 100k-deep JSON, too large) get 4xx in
OpenAI's error shape; n > 1, prompt lists, logprobs and echo (lm-evaluation-harness's
loglikelihood request, checked against the reference model's log-softmax), the sampling fields
(checked against the reference's choices with the same parameters), /tokenize, /detokenize,
/v1/models/{id}, CORS and X-Request-Id."""

from __future__ import annotations

import concurrent.futures
import itertools
import re

import numpy as np
import openai
import pytest
import requests
import torch
from served import Served
from transformers import AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from splash_core.checkpoint.source import weight_source
from splash_core.checkpoint.tiny import ensure
from splash_core.engine import reference_check
from splash_core.profiles import load
from splash_core.runtime.reference_model import ReferenceModel
from splash_core.runtime.sampling import SamplingParams

ORIGIN = "http://client.test"
MAX_PROMPT = 400
MAX_BODY = 1_000_000
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server():
    s = Served("--policy", "TP", "--kv-pages", "64", "--max-body-bytes", str(MAX_BODY), "--max-prompt-tokens",
               str(MAX_PROMPT), "--allowed-origins", ORIGIN)
    yield s
    s.kill()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def hf():
    return AutoTokenizer.from_pretrained(ensure("tiny-deepseek-v3"))


@pytest.fixture(scope="module")
def log_softmax():
    """The reference model's log-softmax [n, V] (float64) after each position of a token sequence."""
    deployment = load("deployment", "cpu-tiny")
    reference = ReferenceModel(deployment.model, weight_source(deployment.model, deployment.seed))
    ids = itertools.count()

    def run(tokens) -> torch.Tensor:
        h = reference.forward(next(ids), 0, torch.as_tensor(tokens, dtype=torch.long))
        return torch.log_softmax(reference.logits(h).double(), dim=-1)

    return run


def _raw(server, path: str, data: bytes, **headers) -> requests.Response:
    return requests.post(server.url + path, data=data, timeout=120,
                         headers={"Content-Type": "application/json", **headers})


def _error(r: requests.Response, status: int, param: str, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert error["message"].startswith(param + ":") and "\n" not in error["message"], error
    if code is not None:
        assert error["code"] == code, error
    return error


def test_malformed_bodies_get_400_in_openai_shape_and_the_server_keeps_serving(server):
    deep = b"[" * 100_000 + b"]" * 100_000
    cases = [(b'{"prompt": "hi", "max_tokens": NaN}', "body"), (b'{"prompt": "hi", "max_tokens": Infinity}', "body"),
             (b'{"prompt": "hi", "max_tokens": 1e400}', "max_tokens"),
             (b'{"prompt": "hi", "temperature": 1e400}', "temperature"),
             (b'{"prompt": "hi", "temperature": -Infinity}', "body"),
             (b'{"prompt": "\\ud800 lone"}', "body"), (b'{"prompt": "\xff\xfe"}', "body"), (deep, "body"),
             (b'{"prompt": ' + deep + b"}", "body"), (b"[1, 2]", "body"), (b"", "body"),
             (b'{"prompt": "hi", "max_tokens": "5"}', "max_tokens"),
             (b'{"prompt": "hi", "max_tokens": 2.0}', "max_tokens"),
             (b'{"prompt": "hi", "n": 1000000}', "n"), (b'{"prompt": "hi", "seed": 1e30}', "seed"),
             (b'{"prompt": [], "max_tokens": 2}', "prompt"), (b'{"prompt": [[1, 2], "mixed", 3]}', "prompt")]
    for body, param in cases:
        _error(_raw(server, "/v1/completions", body), 400, param)
    _error(_raw(server, "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "top_p": NaN}'),
           400, "body")
    _error(_raw(server, "/generate", b'{"text": "hi", "sampling_params": {"max_new_tokens": 1e400}}'), 400,
           "sampling_params.max_new_tokens")
    assert server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}).json()["usage"]["completion_tokens"] == 2
    assert "Traceback" not in server.log


def test_fields_that_used_to_be_ignored_are_refused_by_name(server, client, model):
    refused = [("/v1/completions", {"response_format": {"type": "json_object"}}, "response_format"),
               ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {}}},
                "response_format"),
               ("/v1/completions", {"guided_json": {"type": "object"}}, "guided_json"),
               ("/v1/completions", {"priority": 5}, "priority"),
               ("/v1/completions", {"logit_bias": {"5": 3}}, "logit_bias"),
               ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools"),
               ("/v1/completions", {"best_of": 3}, "best_of"), ("/v1/completions", {"suffix": "x"}, "suffix"),
               ("/v1/completions", {"no_such_field": 1}, "no_such_field"),
               ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
               ("/generate", {"sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
               ("/generate", {"sampling_params": {"json_schema": "{}"}}, "sampling_params.json_schema"),
               ("/generate", {"return_logprob": True}, "return_logprob"),
               ("/generate", {"json_schema": "{}"}, "json_schema")]
    base = {"/v1/completions": {"prompt": "hi", "max_tokens": 2},
            "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            "/generate": {"text": "hi"}}
    for path, extra, param in refused:
        body = {**base[path], **extra}
        _error(server.post(path, body), 400, param, "unsupported_parameter")
    with pytest.raises(openai.BadRequestError) as caught:  # as the openai client sees it
        client.completions.create(model=model, prompt="hi", max_tokens=2, extra_body={"guided_json": {}})
    assert caught.value.body["param"] == "guided_json" and caught.value.body["code"] == "unsupported_parameter"
    # what sglang.bench_serving sends to /generate: the same fields at their "not asked for" values
    bench = {"text": "hi", "sampling_params": {"temperature": 0.0, "max_new_tokens": 2, "ignore_eos": True},
             "stream": False, "lora_path": None, "return_logprob": False, "return_routed_experts": False,
             "logprob_start_len": -1}
    assert server.post("/generate", bench).json()["meta_info"]["completion_tokens"] == 2


def test_a_tiny_temperature_is_greedy_not_garbage(client, model):
    same = dict(model=model, prompt=PROMPT, max_tokens=8, extra_body={"ignore_eos": True})
    greedy = client.completions.create(temperature=0, **same).choices[0].text
    assert client.completions.create(temperature=1e-308, **same).choices[0].text == greedy


def test_n_choices_and_prompt_lists_are_each_a_choice_with_its_index(client, model, hf):
    same = dict(model=model, max_tokens=6, extra_body={"ignore_eos": True})
    prompts = [PROMPT, "The capital of France"]
    alone = [client.completions.create(prompt=p, temperature=0, **same).choices[0].text for p in prompts]
    both = client.completions.create(prompt=prompts, n=2, temperature=0, **same)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [alone[0], alone[0], alone[1], alone[1]]
    assert both.usage.prompt_tokens == sum(len(hf(p)["input_ids"]) for p in prompts)  # each prompt once
    assert both.usage.completion_tokens == 24
    ids = client.completions.create(prompt=[hf(p)["input_ids"] for p in prompts], temperature=0, **same)
    assert [c.text for c in ids.choices] == alone  # token-id prompts, as lm-eval sends them
    sampled = dict(prompt=PROMPT, n=3, temperature=1.0, seed=11, best_of=3, **same)
    first, again = (client.completions.create(**sampled) for _ in range(2))
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in again.choices] and len(set(texts)) > 1  # seeded, and a seed per choice
    chat = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], n=2, temperature=0, **same)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content
    chunks = list(client.completions.create(prompt=prompts, n=2, temperature=0, stream=True, **same))
    streamed = {i: "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(4)}
    assert list(streamed.values()) == [alone[0], alone[0], alone[1], alone[1]]
    assert sum(c.choices[0].finish_reason == "length" for c in chunks) == 4


def test_lm_eval_loglikelihood_requests_get_the_reference_models_logprobs(server, hf, log_softmax):
    """lm-evaluation-harness's loglikelihood request, as its local-completions model sends it."""
    contexts = [hf("The quick brown fox")["input_ids"], hf(PROMPT)["input_ids"]]
    continuations = [hf(" jumps over", add_special_tokens=False)["input_ids"],
                     hf(" there was", add_special_tokens=False)["input_ids"]]
    prompts = [c + k for c, k in zip(contexts, continuations)]
    body = {"model": server.get("/v1/models").json()["data"][0]["id"], "prompt": prompts, "max_tokens": 0,
            "temperature": 0, "logprobs": 1, "echo": True, "seed": 1234}
    out = server.post("/v1/completions", body).json()
    assert out["usage"]["completion_tokens"] == 0 and len(out["choices"]) == 2
    for choice, prompt, context in zip(sorted(out["choices"], key=lambda c: c["index"]), prompts, contexts):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(prompt)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts the first
        expected = log_softmax(prompt)
        want = [float(expected[i - 1, prompt[i]]) for i in range(1, len(prompt))]
        assert np.allclose(lp["token_logprobs"][1:], want, atol=1e-4), (lp["token_logprobs"], want)
        for i in range(1, len(prompt)):  # the top 1 and the chosen token
            best = int(expected[i - 1].argmax())
            top = lp["top_logprobs"][i]
            assert abs(top[_name(hf, best)] - float(expected[i - 1, best])) < 1e-4
            assert lp["tokens"][i] in top and len(top) <= 2
        assert lp["text_offset"] == list(np.cumsum([0] + [len(t) for t in lp["tokens"][:-1]]))
        assert choice["text"] == hf.decode(prompt)  # the echoed prompt, special tokens included
        continuation = sum(lp["token_logprobs"][len(context):])  # what lm-eval sums
        assert np.isfinite(continuation) and continuation < 0


def test_logprobs_of_generated_tokens_whole_and_streamed(server, client, model, log_softmax, hf):
    same = dict(model=model, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(prompt=PROMPT, logprobs=3, **same).choices[0]
    prompt = hf(PROMPT)["input_ids"]
    out = _generated(server, prompt, 5)
    expected = log_softmax(prompt + out)
    want = [float(expected[len(prompt) - 1 + i, t]) for i, t in enumerate(out)]
    assert np.allclose(whole.logprobs.token_logprobs, want, atol=1e-4)
    assert whole.logprobs.tokens == [_name(hf, t) for t in out]
    assert all(len(top) == 3 and max(top.values()) == v  # greedy: the chosen token is the most likely
               for top, v in zip(whole.logprobs.top_logprobs, whole.logprobs.token_logprobs))
    chunks = list(client.completions.create(prompt=PROMPT, logprobs=3, stream=True, **same))
    assert [c.choices[0].logprobs.token_logprobs[0] for c in chunks if c.choices[0].logprobs] == \
        whole.logprobs.token_logprobs
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(messages=messages, logprobs=True, top_logprobs=2, **same).choices[0]
    ids = server.post("/tokenize", {"messages": messages}).json()["tokens"]
    out = _generated(server, ids, 5)
    expected = log_softmax(ids + out)
    assert [e.token for e in chat.logprobs.content] == [_name(hf, t) for t in out]
    assert [bytes(e.bytes) for e in chat.logprobs.content] == [_bytes(hf, t) for t in out]
    assert np.allclose([e.logprob for e in chat.logprobs.content],
                       [float(expected[len(ids) - 1 + i, t]) for i, t in enumerate(out)], atol=1e-4)
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob for e in chat.logprobs.content)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(messages=messages, top_logprobs=2, **same)  # without logprobs: true
    with pytest.raises(openai.BadRequestError):
        client.completions.create(prompt=PROMPT, logprobs=21, **same)


def _bytes(hf, token: int) -> bytes:
    """A byte-level token's bytes, by transformers' own table."""
    table = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(table[c] for c in hf.convert_ids_to_tokens(token))


def _name(hf, token: int) -> str:
    """How OpenAI names a token: its text, or ``bytes:\\x..`` where it is part of a character."""
    text = hf.decode([token])
    return text if "\ufffd" not in text else "bytes:" + "".join(f"\\x{b:02x}" for b in _bytes(hf, token))


def _generated(server, prompt: list[int], tokens: int, **sampling) -> list[int]:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True,
                                                     **sampling}}
    return server.post("/generate", body).json()["output_ids"]


def test_sampling_fields_reach_the_engine_as_the_reference_chooses(server, client, model, hf):
    prompt = hf(PROMPT)["input_ids"]
    plain = _generated(server, prompt, 12)
    # a stop id that is the first greedy token ends at once; min_tokens holds it off
    assert _generated(server, prompt, 8, stop_token_ids=[plain[0]]) == plain[:1]
    held = _generated(server, prompt, 8, stop_token_ids=[plain[0]], min_new_tokens=5)
    assert len(held) >= 5 and held[0] != plain[0]
    stop = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stop_token_ids": [plain[0]], "min_tokens": 5}
    assert server.post("/v1/completions", stop).json()["usage"]["completion_tokens"] >= 5
    # a penalty below 1 favours repeating (the plain output repeats no token); presence and
    # frequency penalties then hold the repeats back
    cases = {1: dict(repetition_penalty=0.5),
             2: dict(repetition_penalty=0.5, presence_penalty=2.0, frequency_penalty=1.0),
             3: dict(temperature=1.0, min_p=0.3, seed=5), 4: dict(temperature=0.8, top_k=20, repetition_penalty=1.3,
                                                                  seed=9)}
    outputs, params = {}, {}
    for rid, fields in cases.items():
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True,
                                                         **{k: v for k, v in fields.items() if k != "seed"}}}
        if "seed" in fields:
            body["sampling_params"]["sampling_seed"] = fields["seed"]
        outputs[rid] = server.post("/generate", body).json()["output_ids"]
        sp = body["sampling_params"]
        params[rid] = SamplingParams(sp["temperature"], sp.get("top_k", 0), 1.0, fields.get("seed", 0), (),
                                     seed_alone=True, min_p=sp.get("min_p", 0.0),
                                     repetition_penalty=sp.get("repetition_penalty", 1.0),
                                     presence_penalty=sp.get("presence_penalty", 0.0),
                                     frequency_penalty=sp.get("frequency_penalty", 0.0))
    assert outputs[1] != plain and outputs[2] != outputs[1]  # each penalty changed the greedy tokens
    result = reference_check.check(load("deployment", "cpu-tiny"), {r: np.asarray(prompt) for r in cases}, outputs,
                                   sampling=params)
    assert result.passed and result.tokens == 48, result.line()


def test_stop_strings_with_and_without_include_stop_str_in_output(client, model):
    same = dict(model=model, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    text = client.completions.create(**same).choices[0].text
    stop = text[3:6]
    cut = client.completions.create(stop=[stop], **same).choices[0]
    kept = client.completions.create(stop=[stop], **{**same, "extra_body": {"ignore_eos": True,
                                                                             "include_stop_str_in_output": True}})
    assert cut.text == text[:text.find(stop)] and cut.finish_reason == "stop"
    assert kept.choices[0].text == text[:text.find(stop) + len(stop)] and kept.choices[0].finish_reason == "stop"


def test_tokenize_detokenize_and_chat_template_kwargs(server, client, model, hf):
    out = server.post("/tokenize", {"prompt": PROMPT}).json()
    assert out["tokens"] == hf(PROMPT)["input_ids"] and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 512
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    chat = server.post("/tokenize", {"messages": messages}).json()
    assert chat["tokens"] == hf(rendered, add_special_tokens=False)["input_ids"]
    assert server.post("/detokenize", {"tokens": chat["tokens"]}).json()["prompt"] == rendered
    # the tiny template writes {{ bos_token }}: a template variable the request sets
    bare = server.post("/tokenize", {"messages": messages, "chat_template_kwargs": {"bos_token": ""}}).json()
    assert bare["tokens"] == chat["tokens"][1:]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=2,
                                           extra_body={"chat_template_kwargs": {"bos_token": ""}})
    assert reply.usage.prompt_tokens == len(chat["tokens"]) - 1
    _error(server.post("/tokenize", {"messages": messages, "chat_template_kwargs": {"messages": []}}), 400,
           "chat_template_kwargs")
    _error(server.post("/detokenize", {"tokens": [1, 10**6]}), 400, "tokens")
    _error(server.post("/tokenize", {}), 400, "prompt", "missing_required_parameter")


def test_models_by_id_cors_request_ids_and_response_ids(server, client, model):
    assert client.models.retrieve(model).id == model
    missing = server.get("/v1/models/no-such-model")
    assert _error(missing, 404, "model", "model_not_found")["type"] == "not_found_error"
    preflight = requests.options(server.url + "/v1/completions", timeout=60, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
    other = requests.get(server.url + "/v1/models", headers={"Origin": "http://elsewhere.test"}, timeout=60)
    assert "access-control-allow-origin" not in other.headers
    mine = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 1}, headers={"X-Request-Id": "abc-123"})
    assert mine.headers["x-request-id"] == "abc-123"
    fresh = [server.post("/v1/completions", {"prompt": "hi", "max_tokens": 1}) for _ in range(2)]
    assert fresh[0].headers["x-request-id"] != fresh[1].headers["x-request-id"]
    ids = [r.json()["id"] for r in fresh]
    assert all(re.fullmatch(r"cmpl-[0-9a-f]{32}", i) for i in ids) and ids[0] != ids[1]  # uuid4: unique across restarts
    nowhere = server.post("/v1/nothing", {})
    assert nowhere.status_code == 404 and nowhere.json()["error"]["type"] == "not_found_error"


def test_body_and_prompt_limits_and_a_huge_prompt_blocks_no_one(server):
    _error(_raw(server, "/v1/completions", b'{"prompt": "' + b"a" * MAX_BODY + b'"}'), 413, "body", "body_too_large")
    _error(server.post("/v1/completions", {"prompt": list(range(5, 5 + MAX_PROMPT + 1))}), 400, "prompt",
           "prompt_too_long")
    huge = {"prompt": "hello world, this is a long prompt. " * 12_000}  # under the body limit; 1-3 s to tokenize
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.post, "/v1/completions", huge)
        answered = 0
        while not pending.done():  # other clients are answered while it is read and tokenized
            assert requests.get(server.url + "/health", timeout=60).status_code == 200
            answered += 1
        _error(pending.result(), 400, "prompt", "prompt_too_long")
    # tokenizing on the event loop answers none (or the one or two that came in before the body did);
    # off the loop, a /health takes milliseconds against the prompt's second or more
    assert answered >= 10, answered
    assert server.post("/v1/completions", {"prompt": "hi", "max_tokens": 1}).json()["choices"]
