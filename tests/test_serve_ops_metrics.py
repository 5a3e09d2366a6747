"""The server's metrics and log lines from rank 0's step reports, without a server: what vLLM's
and SGLang's dashboards read (``model_name`` on every sample, the KV cache's use from 0 to 1, queue
times, finished requests by reason, prompt and generated tokens), parsed back with
prometheus_client's own text parser; one log line per switch; a stats line while busy only."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from splash_core.engine.messages import StepReport
from splash_core.server.metrics import LOGGER, Metrics, StatsLine, kv_usage

SWITCH = {"src": "TP", "dst": "CP", "reason": "switch TP -> CP: prefill-heavy", "refused": False, "exposed_ms": 12.5,
          "kind": "one_step", "precopy": {}}
REFUSED = {**SWITCH, "src": "CP", "dst": "DP", "reason": "DP cannot hold the running requests", "refused": True,
           "exposed_ms": 0.0}


def _samples(metrics: Metrics) -> dict:
    text = metrics.render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted({"model_name": "tiny", **labels}.items())))]


def test_every_sample_names_the_model_and_the_step_reports_fill_what_dashboards_read(caplog):
    m = Metrics("tiny")
    pools = ({"pages": 64, "used": 16, "free": 48}, {"pages": 64, "used": 48, "free": 16})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        m.on_step(StepReport(1, "CP", 0.02, "switch", 8, tokens=((0, 5),), switches=(SWITCH, REFUSED), waiting=2,
                             running=1, pools=pools, queued=((0, 0.004), (1, 0.3))))
    m.on_end("finished", 7, 0.0, [0.5, 0.6], "length")
    m.on_end("finished", 3, 0.0, [0.5], "stop")
    m.on_end("aborted", 4, 0.0, [], "abort")
    samples = _samples(m)
    assert all(dict(labels).get("model_name") == "tiny" for _, labels in samples), "a sample without model_name"
    assert _value(samples, "splash_kv_cache_usage_perc") == 0.75  # the busiest rank: 48 of 64 pages
    assert _value(samples, "splash_kv_pages", rank="1", state="free") == 16
    assert _value(samples, "splash_request_queue_time_seconds_count") == 2
    assert _value(samples, "splash_request_queue_time_seconds_sum") == pytest.approx(0.304)
    assert _value(samples, "splash_request_queue_time_seconds_bucket", le="0.005") == 1
    assert _value(samples, "splash_request_success_total", finished_reason="length") == 1
    assert _value(samples, "splash_request_success_total", finished_reason="stop") == 1
    assert _value(samples, "splash_requests_total", state="aborted") == 1  # ended, but not a success
    assert _value(samples, "splash_prompt_tokens_total") == 14
    assert _value(samples, "splash_requests_waiting") == 2 and _value(samples, "splash_requests_running") == 1
    assert _value(samples, "splash_layout", layout="CP") == 1 and _value(samples, "splash_layout", layout="TP") == 0
    assert _value(samples, "splash_switches_total", src="TP", dst="CP", kind="one_step") == 1
    assert _value(samples, "splash_switches_refused_total", src="CP", dst="DP") == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["switch TP -> CP (prefill-heavy): 12.5 ms exposed, one step",
                     "switch CP -> DP refused (DP cannot hold the running requests)"]


def test_the_kv_cache_use_is_a_fraction_even_of_empty_pools():
    assert kv_usage([{"pages": 0, "used": 0, "free": 0}]) == 0.0 and kv_usage([]) == 0.0
    m = Metrics("tiny")
    m.on_step(StepReport(1, "TP", pools=({"pages": 8, "used": 8, "free": 0},)))
    m.on_step(StepReport(2, "TP", pools=None))  # a report without pools keeps the last reading
    assert _value(_samples(m), "splash_kv_cache_usage_perc") == 1.0


def test_the_stats_line_shows_throughput_and_state_while_busy_and_goes_quiet_when_idle():
    m = Metrics("tiny")
    stats = StatsLine(m)
    assert stats.line(now=stats.last[0] + 1) is None  # idle from the start: nothing to say
    m.on_step(StepReport(1, "DP", 0.01, "decode", 2, running=2, waiting=1, switches=(SWITCH,),
                         pools=({"pages": 10, "used": 5, "free": 5},)))
    for _ in range(30):
        m.generated.inc()
    m.on_end("finished", 40, 0.0, [1.0], "length")
    line = stats.line(now=stats.last[0] + 2)
    assert line == ("stats: 20.0 prompt tokens/s, 15.0 generated tokens/s; 2 running, 1 waiting; KV cache 50.0% "
                    "used; layout DP (1 switch)"), line
    m.on_step(StepReport(2, "DP", running=0, waiting=0))
    assert stats.line(now=stats.last[0] + 2).startswith("stats: 0.0 prompt tokens/s, 0.0 generated tokens/s; 0 running")
    assert stats.line(now=stats.last[0] + 2) is None  # said it went idle once; quiet since
