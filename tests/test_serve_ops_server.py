"""Operating a real ``splash serve`` (console script, loopback, two CPU ranks, a policy that
switches every two steps): the served model's name and a ``--chat-template`` file reach the
OpenAI client; /metrics, parsed by prometheus_client, carries what vLLM's and SGLang's dashboards
read; stderr holds timestamped log lines, one per switch and a stats line while busy; and a second
SIGTERM while draining stops the server in seconds, non-zero, in one line, with no traceback and
no rank left. One server for the module: its last test stops it."""

from __future__ import annotations

import json
import re
import signal
import time

import openai
import pytest
from served import Served, metric, wait_for

from splash_core.checkpoint.tiny import ensure
from splash_core.checkpoint.tokenizer import Tokenizer

NAME = "my-model"
TEMPLATE = ("{{ bos_token }}You are a test.{% for m in messages %}<｜User｜>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}")
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    s = Served("--policy", "script:TP,DOP,CP:2", "--kv-pages", "64", "--max-running", "8", "--served-model-name",
               NAME, "--chat-template", str(template), "--log-stats-interval", "0.5")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_the_served_name_and_the_given_chat_template_reach_the_client(server, client):
    assert [m.id for m in client.models.list().data] == [NAME]
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=2,
                                          temperature=0, extra_body={"ignore_eos": True})
    tokenizer = Tokenizer(ensure("tiny-deepseek-v3"))
    ours = tokenizer.encode(Tokenizer(tokenizer.folder, chat_template=TEMPLATE).render_chat(
        [{"role": "user", "content": "Hello"}]), add_special_tokens=False)
    theirs = tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": "Hello"}]), add_special_tokens=False)
    assert chat.usage.prompt_tokens == len(ours) != len(theirs)  # rendered with the file, not the checkpoint's


def test_metrics_carry_the_model_name_kv_use_queue_times_and_finish_reasons(server, client):
    before = server.metrics()
    same = dict(model=NAME, prompt="Once upon a time", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    text = client.completions.create(**same).choices[0].text
    cut = client.completions.create(**same, stop=[text[4:7]])
    assert cut.choices[0].finish_reason == "stop"
    body = {"prompt": "Once upon a time", "max_tokens": 300, "stream": True, "ignore_eos": True}
    with server.post("/v1/completions", body, stream=True) as r:  # running: its pages show in the KV cache's use
        events = (line for line in r.iter_lines() if line.startswith(b"data: "))
        next(events)
        busy = wait_for(lambda: (m := server.metrics()) and metric(m, "splash_kv_cache_usage_perc") > 0 and m,
                        what="the KV cache's use to show the running request")
    assert 0 < metric(busy, "splash_kv_cache_usage_perc") <= 1
    after = wait_for(lambda: (m := server.metrics()) and metric(m, "splash_requests_running") == 0 and m,
                     what="the aborted stream to end")
    assert all(dict(labels).get("model_name") == NAME for _, labels in after), "a sample without model_name"
    grew = lambda name, **labels: metric(after, name, **labels) - metric(before, name, **labels)  # noqa: E731
    assert grew("splash_request_success_total", finished_reason="length") == 1
    assert grew("splash_request_success_total", finished_reason="stop") == 1
    assert grew("splash_requests_total", state="aborted") == 1
    assert grew("splash_request_queue_time_seconds_count") == 3
    assert grew("splash_prompt_tokens_total") == 3 * cut.usage.prompt_tokens
    assert grew("splash_generation_tokens_total") >= 10 + cut.usage.completion_tokens + 1


def test_the_log_has_timestamps_a_line_per_switch_and_stats_while_busy(server):
    log = server.log
    lines = [line for line in log.splitlines() if " splash serve: " in line]
    assert lines and all(STAMP.match(line) for line in lines), lines[:5]
    assert any(re.search(r" INFO splash serve: ready on http://127\.0\.0\.1:\d+ serving 'my-model'", x) for x in lines)
    assert any(re.search(r"splash serve: chat template: .*chat\.jinja$", x) for x in lines)
    switches = [x for x in lines if re.search(r"splash serve: switch (TP|DOP|CP) -> (TP|DOP|CP) \(.+\): [\d.]+ ms "
                                             r"exposed", x)]
    assert len(switches) >= 3, lines
    stats = [x for x in lines if "splash serve: stats: " in x]
    assert any(re.search(r"stats: [\d.]+ prompt tokens/s, [1-9][\d.]* generated tokens/s; \d+ running, \d+ waiting; "
                         r"KV cache [\d.]+% used; layout (TP|DOP|CP) \(\d+ switch", x) for x in stats), stats
    assert any(STAMP.match(x) and "uvicorn.access: " in x and "/v1/completions" in x for x in log.splitlines())
    assert "Traceback" not in log


def test_a_second_sigterm_while_draining_stops_at_once_in_one_line(server):
    body = {"prompt": "Once upon a time", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with server.post("/v1/completions", body, stream=True) as r:
        events = (line for line in r.iter_lines() if line.startswith(b"data: "))
        next(events)
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "splash serve: stopping:" in server.log, what="the server to start draining")
        server.proc.send_signal(signal.SIGTERM)
        second = time.monotonic()
        rest = [json.loads(e[6:]) for e in events if e != b"data: [DONE]"]
    assert server.wait() == 128 + signal.SIGTERM, server.log
    assert time.monotonic() - second < 8, "the second signal did not stop the server promptly"
    assert rest[-1]["choices"][0]["finish_reason"] is not None and len(rest) < 399  # aborted, not run to the end
    assert not server.orphans(), "orphaned ranks"
    log = server.log
    assert log.count("stopping at once") == 1 and "Traceback" not in log and "splash: " not in log, log[-2000:]
    assert re.search(r"WARNING splash serve: stopping at once \(a second signal\): 1 request in flight aborted", log)
