"""``splash serve`` end to end, driven by clients nobody here wrote: the official ``openai`` client
and SGLang's own load generator (``python -m sglang.bench_serving``), against one server on the
CPU main job's tiny checkpoint whose policy forces a layout switch every two steps, so requests
arrive and finish during switches. Served tokens equal the single-device reference; token
counts, latencies and /metrics agree with what the clients measured; bad requests get 400/401
naming the field; a client that disconnects has its pages freed on every rank; SIGTERM drains
and exits 0 with no rank left; a crashed rank turns into 503 with the cause and exit code 1."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import openai
import pytest
import requests
from served import Served, metric, wait_for
from transformers import AutoTokenizer

from splash_core.checkpoint.tiny import ensure
from splash_core.cli.main import main
from splash_core.engine import reference_check
from splash_core.profiles import load

KEY = "test-key"
SWITCHING = "script:TP,DOP,CP:2"  # a switch every two steps: TP -> DOP -> CP -> TP ...
# 64 pages of 16 tokens per layer and rank; --context-length beyond the model's 512 positions so
# that a request can fit the context yet never the KV pool (CP, the roomiest layout, holds 2 x 64 pages)
SERVER_ARGS = ("--policy", SWITCHING, "--kv-pages", "64", "--context-length", "4096", "--max-running", "16")


@pytest.fixture(scope="module")
def server():
    s = Served(*SERVER_ARGS, api_key=KEY)
    yield s
    s.kill()


@pytest.fixture(scope="module")
def folder():
    return ensure("tiny-deepseek-v3")


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_the_openai_client_streaming_and_not_counts_what_the_server_bills(server, folder):
    client = _client(server)
    model = client.models.list().data[0].id
    assert model == "tiny-deepseek-v3"  # the checkpoint's name, not its cache path (tests/test_serve_ops_*)
    before = server.metrics()
    hf = AutoTokenizer.from_pretrained(folder)
    same = dict(model=model, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(prompt="Once upon a time", **same)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens == len(hf("Once upon a time")["input_ids"])
    chunks = list(client.completions.create(prompt="Once upon a time", stream=True,
                                            stream_options={"include_usage": True}, **same))
    tokens = [c for c in chunks if c.choices]  # one chunk per generated token, then the usage
    assert len(tokens) == chunks[-1].usage.completion_tokens == 12
    assert "".join(c.choices[0].text for c in tokens) == whole.choices[0].text  # greedy: the same in every layout
    assert tokens[-1].choices[0].finish_reason == "length"

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # transformers' template
    prompt = len(hf(rendered, add_special_tokens=False)["input_ids"])
    chat = client.chat.completions.create(messages=messages, **same)
    assert chat.usage.prompt_tokens == prompt and chat.usage.completion_tokens == 12
    streamed = list(client.chat.completions.create(messages=messages, stream=True,
                                                   stream_options={"include_usage": True}, **same))
    parts = [c for c in streamed if c.choices]
    assert parts[0].choices[0].delta.role == "assistant" and len(parts) == streamed[-1].usage.completion_tokens == 12
    assert "".join(c.choices[0].delta.content for c in parts) == chat.choices[0].message.content

    after = server.metrics()
    grew = lambda name, **labels: metric(after, name, **labels) - metric(before, name, **labels)  # noqa: E731
    assert grew("splash_requests_total", state="finished") == 4
    assert grew("splash_generation_tokens_total") == 48
    text = whole.choices[0].text  # a stop string cuts the text where it first appears, and is not sent
    cut = client.completions.create(prompt="Once upon a time", stop=[text[4:7]], **same)
    assert cut.choices[0].text == text[:text.find(text[4:7])] and cut.choices[0].finish_reason == "stop"
    draws = [client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=1.0,
                                       top_p=0.9, seed=seed, extra_body={"top_k": 50, "ignore_eos": True})
             .choices[0].text for seed in (7, 7, 8)]
    assert draws[0] == draws[1] != draws[2]  # a seed gives the same tokens in any request
    assert grew("splash_prompt_tokens_total") == 2 * whole.usage.prompt_tokens + 2 * prompt
    assert grew("splash_time_to_first_token_seconds_count") == 4 and grew("splash_inter_token_latency_seconds_count") == 44


def test_requests_that_arrive_and_finish_during_switches_get_the_references_tokens(server):
    before = server.metrics()
    rng = np.random.default_rng(5)
    prompts = {i: rng.integers(4, 380, size=int(n)).tolist() for i, n in enumerate(rng.integers(5, 120, size=8))}
    lengths = {i: int(n) for i, n in zip(prompts, rng.integers(6, 30, size=8))}

    def one(i):
        time.sleep(0.15 * i)  # staggered: each arrives while others prefill, decode or switch
        body = {"input_ids": prompts[i], "sampling_params": {"max_new_tokens": lengths[i], "temperature": 0,
                                                             "ignore_eos": True}}
        return server.post("/generate", body).json()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outputs = dict(zip(prompts, pool.map(one, prompts)))
    for i, out in outputs.items():
        assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) == lengths[i], out
        assert out["meta_info"]["finish_reason"]["type"] == "length"
    result = reference_check.check(load("deployment", "cpu-tiny"), {i: np.asarray(p) for i, p in prompts.items()},
                                   {i: o["output_ids"] for i, o in outputs.items()})
    assert result.passed and result.exact and result.tokens == sum(lengths.values()), result.line()
    after = server.metrics()
    switched = sum(v - before.get(k, 0.0) for k, v in after.items() if k[0] == "splash_switches_total")
    assert switched >= 3  # every direction of the script, while these requests ran
    assert any(k[0] == "splash_step_seconds_count" and dict(k[1])["phase"] == "switch" for k in after)


@pytest.mark.parametrize("backend, rate", [("sglang-oai", "16"), ("sglang", "inf")])
def test_sglang_bench_serving_completes_every_request(server, folder, tmp_path, backend, rate):
    before = server.metrics()
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", backend, "--base-url", server.url,
           "--dataset-name", "random-ids", "--tokenizer", folder, "--num-prompts", "24", "--random-input-len", "96",
           "--random-output-len", "16", "--random-range-ratio", "0.25", "--request-rate", rate, "--seed", "3",
           "--warmup-requests", "1", "--output-file", str(out), "--output-details", "--disable-tqdm"]
    env = {**os.environ, "OPENAI_API_KEY": KEY, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == 24 and not any(result["errors"]), result["errors"]
    assert result["mean_ttft_ms"] > 0 and result["mean_itl_ms"] > 0 and all(t > 0 for t in result["ttfts"])
    assert result["server_info"]["policy"] == SWITCHING
    after = server.metrics()
    grew = lambda name, **labels: metric(after, name, **labels) - metric(before, name, **labels)  # noqa: E731
    warmup = result["output_lens"][0]  # the warmup request repeats the first (its output is at most 32 tokens)
    assert grew("splash_requests_total", state="finished") == 25
    assert grew("splash_generation_tokens_total") == sum(result["output_lens"]) + warmup
    assert grew("splash_time_to_first_token_seconds_count") == 25


def test_bad_requests_get_400_naming_the_field_and_the_server_keeps_serving(server):
    cases = [("/v1/completions", b"{not json", "body"),
             ("/v1/completions", {"prompt": "hi", "model": "another-model"}, "model"),
             ("/v1/completions", {"max_tokens": 4}, "prompt"),
             ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
             ("/v1/completions", {"prompt": "hi", "n": 0}, "n"),
             ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
             ("/v1/completions", {"prompt": [1, 2, 999999]}, "prompt"),
             ("/v1/chat/completions", {"max_tokens": 4}, "messages"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
             ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
             # fits the 4096-token context, never the KV pool: 132 pages, 66 per rank in CP (of 64)
             ("/v1/completions", {"prompt": list(range(5, 105)), "max_tokens": 2000}, "max_tokens")]
    for path, body, field in cases:
        kw = {"data": body} if isinstance(body, bytes) else {"json": body}
        r = requests.post(server.url + path, headers=server.headers, timeout=60, **kw)
        assert r.status_code == 400, (path, body, r.text)
        error = r.json()["error"]
        assert error["param"] == field and error["message"].startswith(field) and error["type"] == "invalid_request_error"
    assert "never fit the KV pool" in error["message"] and error["code"] == "kv_capacity_exceeded"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = requests.post(server.url + "/v1/completions", json={"prompt": "hi"}, headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert requests.get(server.url + "/health", timeout=60).status_code == 200  # open, like /metrics
    assert server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}).json()["usage"]["completion_tokens"] == 2


def test_what_cannot_start_says_so_in_one_line_before_any_rank_starts(server, capsys):
    port = server.url.rsplit(":", 1)[1]  # in use by the module's server
    for args, message in ((["--port", port], f"--port {port}: cannot listen on 127.0.0.1:{port}: "),
                          (["--policy", "XP"], "--policy: unknown policy 'XP'"),
                          (["--model", "/no/such/folder"], "/no/such/folder: (folder): no checkpoint folder here")):
        assert main(["serve", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("splash serve: error: " + message) and err.count("\n") == 1, err


def test_a_client_that_disconnects_mid_stream_frees_its_pages_on_every_rank(server):
    before = server.metrics()
    body = {"prompt": "Once upon a time", "max_tokens": 300, "stream": True, "ignore_eos": True}
    with server.post("/v1/completions", body, stream=True) as r:
        events = (line for line in r.iter_lines() if line.startswith(b"data: "))
        got = [next(events) for _ in range(3)]
    assert all(json.loads(e[6:])["choices"][0]["finish_reason"] is None for e in got)
    # the connection is closed: the request is aborted at the next step boundary, its pages freed
    def settled():
        m = server.metrics()
        used = [metric(m, "splash_kv_pages", rank=str(r), state="used") for r in range(2)]
        aborted = metric(m, "splash_requests_total", state="aborted") - metric(before, "splash_requests_total",
                                                                                 state="aborted")
        return aborted == 1 and used == [0, 0] and metric(m, "splash_requests_running") == 0 and m
    m = wait_for(settled, what="the aborted request's pages to be freed on both ranks")
    assert metric(m, "splash_kv_pages", rank="1", state="free") == 64
    assert metric(m, "splash_generation_tokens_total") - metric(before, "splash_generation_tokens_total") < 300


def test_sigterm_lets_requests_in_flight_finish_then_exits_0_with_no_rank_left(server):
    body = {"prompt": "Once upon a time", "max_tokens": 40, "stream": True, "ignore_eos": True}
    with server.post("/v1/completions", body, stream=True) as r:
        events = (line for line in r.iter_lines() if line.startswith(b"data: "))
        first = next(events)
        server.proc.send_signal(signal.SIGTERM)
        # the signal is handled between the server's events: wait until it says it drains
        wait_for(lambda: "splash serve: stopping" in server.log, what="the server to start draining")
        late = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        rest = list(events)
    assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
    chunks = [json.loads(e[6:]) for e in [first, *rest] if e != b"data: [DONE]"]
    assert len(chunks) == 40 and chunks[-1]["choices"][0]["finish_reason"] == "length" and rest[-1] == b"data: [DONE]"
    assert server.wait() == 0, server.log
    assert not server.orphans(), "orphaned ranks"
    assert "Traceback" not in server.log and "splash serve: stopped" in server.log


@pytest.mark.parametrize("fault, why", [(signal.SIGKILL, "died during serve_live"),
                                        (signal.SIGSTOP, "collectives time out after 5 s")])
def test_a_rank_that_crashes_or_hangs_gives_503_with_the_cause_and_a_non_zero_exit(fault, why):
    s = Served("--policy", "TP", "--kv-pages", "64", "--timeout", "5")
    try:
        assert len(s.ranks) == 2
        body = {"prompt": "Once upon a time", "max_tokens": 400, "stream": True, "ignore_eos": True}
        with s.post("/v1/completions", body, stream=True) as r:
            events = (line for line in r.iter_lines() if line.startswith(b"data: "))
            next(events)
            os.kill(s.ranks[-1], fault)  # one rank dies, or stops answering
            rest = list(events)
        failure = json.loads(rest[0][6:])["error"]
        assert failure["code"] == "engine_failed" and why in failure["message"], failure
        late = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert late.status_code == 503 and why in late.json()["error"]["message"]
        assert s.wait() == 1, s.log  # by itself: no signal asked it to stop
        assert not s.orphans(), "orphaned ranks"
        assert "splash serve: error: the group stopped: rank" in s.log
    finally:
        s.kill()
