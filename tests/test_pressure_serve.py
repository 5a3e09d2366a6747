"""The server under KV pressure (issue 36 §2), through a real ``splash serve --kv-pages 16`` on
loopback driven by the ``openai`` client: a first request of 400 prompt + 100 output tokens, which
only CP's split pool holds while the server starts in TP, used to kill the whole server (the
switch to CP was refused and the step ran out of pages in TP). Now it finishes with its 100
tokens, and two at once both finish, the second queued behind the first."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest
from served import Served

PROMPT = [(7 * i) % 300 + 3 for i in range(400)]  # 25 pages of 16 tokens: TP's 16 cannot hold it, CP's 13 + 12 can


@pytest.fixture(scope="module")
def server():
    s = Served("--kv-pages", "16")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def _complete(client, prompt):
    return client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=100,
                                     temperature=0, extra_body={"ignore_eos": True})


def test_a_first_request_only_another_layout_holds_finishes(server, client):
    out = _complete(client, PROMPT)
    assert out.usage.completion_tokens == 100 and out.choices[0].finish_reason == "length", out
    assert server.proc.poll() is None and "Traceback" not in server.log, server.log


def test_two_such_requests_at_once_both_finish_one_after_the_other(server, client):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda p: _complete(client, p), [PROMPT, PROMPT[::-1]]))
    assert [o.usage.completion_tokens for o in outs] == [100, 100], outs
    assert server.proc.poll() is None and "Traceback" not in server.log, server.log
