"""The server's Prometheus metrics (``GET /metrics``), kept by the ``prometheus-client`` library.

Request latencies are measured by the front end, as a client sees them less the network: time to
first token from the request's arrival, the gap before every later token, end to end to the last
token. Step times, switches and the KV pool come from rank 0's step reports
(:class:`~splash_core.engine.live.StepReport`); a switch's exposed time is rank 0's.

=========================================  ==========================================================
``splash_requests_total{state}``           requests that ended: finished, aborted, rejected, failed
``splash_requests_waiting``, ``_running``  requests now: arrived but not admitted, and running
``splash_prompt_tokens_total``             prompt tokens of requests that ended
``splash_generation_tokens_total``         tokens generated
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
=========================================  ==========================================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..layouts import LAYOUTS

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
                   10.0, 20.0, 40.0, 80.0, 160.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """One server's metrics in a registry of its own."""

    def __init__(self, served_model: str):
        self.registry = r = CollectorRegistry()
        self.model = served_model
        self.ended = Counter("splash_requests", "requests that ended, by how", ["state"], registry=r)
        self.waiting = Gauge("splash_requests_waiting", "requests that arrived and wait for admission", registry=r)
        self.running = Gauge("splash_requests_running", "requests running", registry=r)
        self.prompt_tokens = Counter("splash_prompt_tokens", "prompt tokens of requests that ended", registry=r)
        self.generated = Counter("splash_generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram("splash_time_to_first_token_seconds", "arrival to first token", buckets=LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram("splash_inter_token_latency_seconds", "gap between a request's tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("splash_e2e_request_latency_seconds", "arrival to last token", buckets=LATENCY_BUCKETS,
                             registry=r)
        self.step = Histogram("splash_step_seconds", "engine step time on rank 0", ["layout", "phase"],
                              buckets=STEP_BUCKETS, registry=r)
        self.layout = Gauge("splash_layout", "1 for the current attention layout", ["layout"], registry=r)
        self.switches = Counter("splash_switches", "layout switches done", ["src", "dst", "kind"], registry=r)
        self.precopies = Counter("splash_precopies", "pre-copies begun and how they ended", ["src", "dst", "event"],
                                 registry=r)
        self.precopied = Counter("splash_precopied_bytes", "bytes pre-copied in the background (group)",
                                 ["src", "dst"], registry=r)
        self.refused = Counter("splash_switches_refused", "switches refused before anything moved", ["src", "dst"],
                               registry=r)
        self.exposed = Counter("splash_switch_exposed_seconds", "exposed switch time (rank 0)", ["src", "dst"],
                               registry=r)
        self.pages = Gauge("splash_kv_pages", "KV pages per MLA layer, busiest layer", ["rank", "state"], registry=r)
        for state in ("finished", "aborted", "rejected", "failed"):
            self.ended.labels(state)

    def set_layout(self, layout: str) -> None:
        for name in LAYOUTS:
            self.layout.labels(str(name)).set(1 if str(name) == layout else 0)

    def on_step(self, report) -> None:
        """Rank 0's :class:`~splash_core.engine.live.StepReport`."""
        if report.phase != "idle":
            self.step.labels(report.layout, report.phase).observe(report.seconds)
        self.set_layout(report.layout)
        self.waiting.set(report.waiting)
        self.running.set(report.running)
        for s in report.switches:
            if s["refused"]:
                self.refused.labels(s["src"], s["dst"]).inc()
            else:
                self.switches.labels(s["src"], s["dst"], s.get("kind", "one_step")).inc()
                self.exposed.labels(s["src"], s["dst"]).inc(s["exposed_ms"] / 1e3)
        for p in report.precopies:
            if p["begun"] == report.step:
                self.precopies.labels(p["src"], p["dst"], "begun").inc()
            if p["ended"] == report.step:
                self.precopies.labels(p["src"], p["dst"], p["outcome"]).inc()
                self.precopied.labels(p["src"], p["dst"]).inc(p["bytes"])
        for rank, pool in enumerate(report.pools or ()):
            self.pages.labels(str(rank), "used").set(pool["used"])
            self.pages.labels(str(rank), "free").set(pool["free"])

    def on_end(self, state: str, prompt_tokens: int, arrived: float, token_times: list[float]) -> None:
        """A request ended (finished, aborted, rejected or failed) after generating at ``token_times``."""
        self.ended.labels(state).inc()
        self.prompt_tokens.inc(prompt_tokens)
        if token_times and state == "finished":
            self.ttft.observe(token_times[0] - arrived)
            self.e2e.observe(token_times[-1] - arrived)
            for a, b in zip(token_times, token_times[1:]):
                self.itl.observe(b - a)

    def render(self) -> bytes:
        return generate_latest(self.registry)
