"""Served benchmark (``served_bench``, ``bench/serve_bench.py``): SGLang's own load generator
against ``splash serve``, per request rate: throughput, time to first token, inter-token and
end-to-end latency as the client measured them, and the switches the server made meanwhile
(from its /metrics)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ..results import Result
from .context import Context
from .markdown import MISSING, table


def render(result: Result, ctx: Context) -> list[str]:
    s = result["summary"]
    w = s["workload"]
    code = s["server_exit_code"]
    ended = "still serving when this was written" if code == -1 else f"exit code {code} after SIGTERM"
    lines = [f"`{s['server_command']}` (ready after {s['server_ready_s']:.0f} s; {ended}), driven by `python -m sglang.bench_serving --backend sglang`: "
             f"{w.get('num_prompts')} prompts of {w.get('input_tokens', ['?', '?'])[0]}–"
             f"{w.get('input_tokens', ['?', '?'])[1]} random tokens, {w.get('output_tokens')} output tokens each, "
             f"{_sampling(w)}.", ""]
    rows = []
    for run in s["runs"]:
        b = run["bench_serving"]
        rows.append([run["rate"], f"{run['completed']}/{w.get('num_prompts', '?')}", _n(b, "request_throughput", 2),
                     _n(b, "output_throughput", 0), _n(b, "median_ttft_ms", 0), _n(b, "p99_ttft_ms", 0),
                     _n(b, "median_itl_ms", 1), _n(b, "p99_itl_ms", 1), _n(b, "median_e2e_latency_ms", 0),
                     _switches(run["metrics"])])
    lines += table(["rate (req/s)", "completed", "req/s", "output tok/s", "TTFT p50 ms", "TTFT p99 ms",
                    "ITL p50 ms", "ITL p99 ms", "E2E p50 ms", "switches (total)"], rows, "rrrrrrrrrl") + [""]
    for why in s["skipped"]:
        lines.append(f"Skipped: {why}.")
    return lines + ([""] if s["skipped"] else [])


def _sampling(workload: dict) -> str:
    """How the requests chose tokens (results before the option existed were greedy)."""
    t, p = workload.get("temperature", 0), workload.get("top_p", 1)
    return "greedy" if not t else f"sampled at temperature {t:g}" + (f", top_p {p:g}" if p < 1 else "")


def _n(values: dict, key: str, digits: int) -> str:
    v = values.get(key)
    return MISSING if v is None else f"{v:,.{digits}f}"


def _switches(metrics: str) -> str:
    """Switches by direction so far (the server's counters are cumulative over its rates)."""
    done = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "splash_switches_total" and sample.value:
                key = f"{sample.labels['src']}→{sample.labels['dst']}"  # summed over the switches' kinds
                done[key] = done.get(key, 0) + int(sample.value)
    return ", ".join(f"{k} {v}" for k, v in sorted(done.items())) or "none"
