"""The server's Prometheus metrics (``GET /metrics``), kept by the ``prometheus-client`` library,
and the log lines of the same events: one per layout switch, and a periodic stats line.

Request latencies are measured by the front end, as a client sees them less the network: time to
first token from the request's arrival, the gap before every later token, end to end to the last
token. Step times, switches, queue times and the KV pool come from rank 0's step reports
(:class:`~splash_core.engine.messages.StepReport`); a switch's exposed time is rank 0's.

Every metric carries ``model_name`` (the served model's name), as vLLM's and SGLang's do, so their
Grafana dashboards can select the model; the names that matter to those dashboards have a
counterpart here (``vllm:kv_cache_usage_perc`` ~ ``splash_kv_cache_usage_perc``,
``vllm:request_queue_time_seconds``, ``vllm:request_success_total{finished_reason}``,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:num_requests_running``...).

=========================================  ==========================================================
``splash_requests_total{state}``           requests that ended: finished, aborted, rejected, failed
``splash_request_success_total``           finished requests by ``finished_reason``: stop or length
``splash_requests_waiting``, ``_running``  requests now: arrived but not admitted, and running
``splash_prompt_tokens_total``             prompt tokens of requests that ended
``splash_generation_tokens_total``         tokens generated
``splash_request_queue_time_seconds``      histogram: arrival at rank 0 to the start of its first step
``splash_time_to_first_token_seconds``     histogram
``splash_inter_token_latency_seconds``     histogram
``splash_e2e_request_latency_seconds``     histogram
``splash_step_seconds{layout,phase}``      histogram of step times; phase prefill, decode, mixed, switch
``splash_layout{layout}``                  1 for the layout of the last step, 0 for the others
``splash_switches_total{src,dst,kind}``    switches done; kind ``one_step``, ``precopy`` (handed off a pre-copy)
                                           or ``fell_back`` (one step after a pre-copy that could not hand off);
                                           ``splash_switches_refused_total{src,dst}``
``splash_switch_exposed_seconds_total``    the switches' exposed time (Eq 7's measured counterpart)
``splash_precopies_total{src,dst,event}``  pre-copies ``begun``, ``handed_off``, ``cancelled``, ``fell_back``
``splash_precopied_bytes_total{src,dst}``  bytes pre-copies received in the background (group), counted as each ends
``splash_kv_pages{rank,state}``            KV pages per MLA layer in use (``used``) and ``free``
``splash_kv_cache_usage_perc``             the fraction (0 to 1) of KV pages in use on the busiest rank
=========================================  ==========================================================
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..layouts import LAYOUTS

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
                   10.0, 20.0, 40.0, 80.0, 160.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LOGGER = "splash serve"  # the server's log lines read "... splash serve: ...", as its command's errors do

log = logging.getLogger(LOGGER)


class Metrics:
    """One server's metrics in a registry of its own."""

    def __init__(self, served_model: str):
        self.registry = r = CollectorRegistry()
        self.model = m = served_model

        def counter(name: str, doc: str, *labels: str):
            return Counter(name, doc, ["model_name", *labels], registry=r)

        def histogram(name: str, doc: str, buckets, *labels: str):
            return Histogram(name, doc, ["model_name", *labels], buckets=buckets, registry=r)

        self.ended = counter("splash_requests", "requests that ended, by how", "state")
        self.success = counter("splash_request_success", "finished requests, by why they finished", "finished_reason")
        self.waiting = Gauge("splash_requests_waiting", "requests that arrived and wait for admission", ["model_name"],
                             registry=r).labels(m)
        self.running = Gauge("splash_requests_running", "requests running", ["model_name"], registry=r).labels(m)
        self.prompt_tokens = counter("splash_prompt_tokens", "prompt tokens of requests that ended").labels(m)
        self.generated = counter("splash_generation_tokens", "tokens generated").labels(m)
        self.queue = histogram("splash_request_queue_time_seconds", "arrival at rank 0 to the start of the "
                               "request's first step", LATENCY_BUCKETS).labels(m)
        self.ttft = histogram("splash_time_to_first_token_seconds", "arrival to first token", LATENCY_BUCKETS).labels(m)
        self.itl = histogram("splash_inter_token_latency_seconds", "gap between a request's tokens",
                             LATENCY_BUCKETS).labels(m)
        self.e2e = histogram("splash_e2e_request_latency_seconds", "arrival to last token", LATENCY_BUCKETS).labels(m)
        self.step = histogram("splash_step_seconds", "engine step time on rank 0", STEP_BUCKETS, "layout", "phase")
        self.layout = Gauge("splash_layout", "1 for the current attention layout", ["model_name", "layout"],
                            registry=r)
        self.switches = counter("splash_switches", "layout switches done", "src", "dst", "kind")
        self.precopies = counter("splash_precopies", "pre-copies begun and how they ended", "src", "dst", "event")
        self.precopied = counter("splash_precopied_bytes", "bytes pre-copied in the background (group)", "src", "dst")
        self.refused = counter("splash_switches_refused", "switches refused before anything moved", "src", "dst")
        self.exposed = counter("splash_switch_exposed_seconds", "exposed switch time (rank 0)", "src", "dst")
        self.pages = Gauge("splash_kv_pages", "KV pages per MLA layer, busiest layer", ["model_name", "rank", "state"],
                           registry=r)
        self.kv_usage = Gauge("splash_kv_cache_usage_perc", "fraction of KV pages in use, busiest rank (0 to 1)",
                              ["model_name"], registry=r).labels(m)
        self.current_layout = ""
        for state in ("finished", "aborted", "rejected", "failed"):
            self.ended.labels(m, state)
        for reason in ("stop", "length"):
            self.success.labels(m, reason)

    def set_layout(self, layout: str) -> None:
        self.current_layout = layout
        for name in LAYOUTS:
            self.layout.labels(self.model, str(name)).set(1 if str(name) == layout else 0)

    def on_step(self, report) -> None:
        """Rank 0's :class:`~splash_core.engine.messages.StepReport`."""
        m = self.model
        if report.phase != "idle":
            self.step.labels(m, report.layout, report.phase).observe(report.seconds)
        self.set_layout(report.layout)
        self.waiting.set(report.waiting)
        self.running.set(report.running)
        for _, seconds in report.queued:
            self.queue.observe(seconds)
        for s in report.switches:
            self._on_switch(s)
        for p in report.precopies:
            if p["begun"] == report.step:
                self.precopies.labels(m, p["src"], p["dst"], "begun").inc()
            if p["ended"] == report.step:
                self.precopies.labels(m, p["src"], p["dst"], p["outcome"]).inc()
                self.precopied.labels(m, p["src"], p["dst"]).inc(p["bytes"])
        if report.pools:
            for rank, pool in enumerate(report.pools):
                self.pages.labels(m, str(rank), "used").set(pool["used"])
                self.pages.labels(m, str(rank), "free").set(pool["free"])
            self.kv_usage.set(kv_usage(report.pools))

    def _on_switch(self, s: dict) -> None:
        """One switch attempted in a step: counted, and one log line."""
        if s["refused"]:
            self.refused.labels(self.model, s["src"], s["dst"]).inc()
            log.info("switch %s -> %s refused (%s)", s["src"], s["dst"], s["reason"])
            return
        kind = s.get("kind", "one_step")
        self.switches.labels(self.model, s["src"], s["dst"], kind).inc()
        self.exposed.labels(self.model, s["src"], s["dst"]).inc(s["exposed_ms"] / 1e3)
        reason = s["reason"].removeprefix(f"switch {s['src']} -> {s['dst']}: ")  # the scheduler's reasons name it
        log.info("switch %s -> %s (%s): %.1f ms exposed, %s", s["src"], s["dst"], reason, s["exposed_ms"],
                 kind.replace("_", " "))

    def on_end(self, state: str, prompt_tokens: int, arrived: float, token_times: list[float],
               reason: str | None = None) -> None:
        """A request ended (finished, aborted, rejected or failed) after generating at ``token_times``;
        a finished one's ``reason`` is its finish reason (stop or length)."""
        self.ended.labels(self.model, state).inc()
        self.prompt_tokens.inc(prompt_tokens)
        if state == "finished" and reason:
            self.success.labels(self.model, reason).inc()
        if token_times and state == "finished":
            self.ttft.observe(token_times[0] - arrived)
            self.e2e.observe(token_times[-1] - arrived)
            for a, b in zip(token_times, token_times[1:]):
                self.itl.observe(b - a)

    def total(self, name: str, **labels: str) -> float:
        """A sample's value now (0 before it exists), e.g. ``total("splash_generation_tokens_total")``."""
        return self.registry.get_sample_value(name, {"model_name": self.model, **labels}) or 0.0

    def render(self) -> bytes:
        return generate_latest(self.registry)


def kv_usage(pools) -> float:
    """The fraction of KV pages in use on the busiest rank (every rank's ``steps.pool_usage``)."""
    return max((p["used"] / p["pages"] for p in pools if p["pages"] > 0), default=0.0)


class StatsLine:
    """The periodic stats line: throughput since the last line, requests running and waiting, the
    KV cache's use and the layout. Nothing while the server stays idle (one line says it went idle)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self.last = (time.monotonic(), 0.0, 0.0, 0.0)  # when, prompt tokens, generated tokens, switches
        self.was_idle = True

    def line(self, now: float | None = None) -> str | None:
        m = self.metrics
        now = time.monotonic() if now is None else now
        totals = (m.total("splash_prompt_tokens_total"), m.total("splash_generation_tokens_total"), self._switches())
        then, *before = self.last
        self.last = (now, *totals)
        running, waiting = m.total("splash_requests_running"), m.total("splash_requests_waiting")
        idle = running == 0 and waiting == 0 and totals == tuple(before)
        if idle and self.was_idle:
            return None
        self.was_idle = idle
        seconds, switches = max(now - then, 1e-9), totals[2] - before[2]
        return (f"stats: {(totals[0] - before[0]) / seconds:.1f} prompt tokens/s, "
                f"{(totals[1] - before[1]) / seconds:.1f} generated tokens/s; {running:.0f} running, {waiting:.0f} "
                f"waiting; KV cache {100 * m.total('splash_kv_cache_usage_perc'):.1f}% used; layout "
                f"{m.current_layout or '-'} ({switches:.0f} {'switch' if switches == 1 else 'switches'})")

    def _switches(self) -> float:
        return sum(s.value for family in self.metrics.registry.collect() if family.name == "splash_switches"
                   for s in family.samples if s.name == "splash_switches_total")
