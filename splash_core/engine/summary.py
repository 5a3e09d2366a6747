"""What a run produced, for people (:func:`render`) and scripts (:meth:`RunSummary.as_dict`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..formatting import number, table
from ..results.stats import percentile

MIB = float(1 << 20)
LATENCY_PERCENTILES = (50, 90, 99)


def latency(requests) -> dict:
    """Time to first token, inter-token and end-to-end latency (ms) of finished ``requests``
    (:class:`~splash_core.engine.requests.Request`, with their arrival and token times): for each,
    the number of samples, the mean and the :data:`LATENCY_PERCENTILES`, from arrival (a workload's
    ``arrival_s``, a server's receipt) to the first token, between tokens, and to the last token."""
    samples = {"ttft_ms": [], "itl_ms": [], "e2e_ms": []}
    for r in requests:
        times = r.token_times
        if not times:
            continue
        samples["ttft_ms"].append((times[0] - r.arrived_at) * 1e3)
        samples["e2e_ms"].append((times[-1] - r.arrived_at) * 1e3)
        samples["itl_ms"] += [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    return {name: describe(values) for name, values in samples.items()}


def describe(values) -> dict:
    """{count, mean, p50, p90, p99} of ``values`` (only the count when there are none)."""
    values = [float(v) for v in values]
    if not values:
        return {"count": 0}
    return {"count": len(values), "mean": sum(values) / len(values),
            **{f"p{q}": percentile(values, q) for q in LATENCY_PERCENTILES}}


@dataclasses.dataclass(frozen=True)
class SwitchSummary:
    """One switch (or refused switch) with what the executor measured, over the whole group."""

    step: int
    src: str
    dst: str
    reason: str
    refused: str = ""  # why it did not happen (then the step ran in src)
    mode: str = ""
    bytes: dict = dataclasses.field(default_factory=dict)  # state -> bytes moved, summed over ranks
    exposed_ms: float = 0.0  # the slowest rank's
    step_ms: float = 0.0  # the slowest rank's
    # the pre-copy it handed off or that fell back to it (``bytes`` then are the handoff's):
    # :class:`~splash_core.engine.precopies.PreCopyRecord` as a dict; empty for a one-step switch
    precopy: dict = dataclasses.field(default_factory=dict)

    @property
    def bytes_total(self) -> int:
        return int(sum(self.bytes.values()))

    @property
    def kind(self) -> str:
        """``precopy`` (handed off a pre-copy), ``one_step``, or ``fell_back`` (a one-step switch
        after its pre-copy could not hand off)."""
        return self.precopy.get("outcome", "one_step").replace("handed_off", "precopy")

    def how(self) -> str:
        """The switch's kind, for people."""
        if not self.precopy:
            return "one step"
        p = self.precopy
        copied = f"pre-copy {p['steps_run']}/{p['steps']} steps, {p['bytes'] / MIB:.2f} MiB ahead"
        if p.get("uncopied"):
            copied += f", {p['uncopied']} layers whole"
        return copied if p["outcome"] == "handed_off" else f"one step after {copied}: {p['why']}"


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """One run of the engine: requests served, throughput, layouts, switches, check."""

    deployment: str
    workload: str
    policy: str
    backend: str
    device: str
    model: str
    T: int
    layers: int
    compute_dtype: str
    kv_pages: int  # per MLA layer and rank
    kv_pages_source: str
    prefill_chunk: int
    requests: int
    served: int
    rejected: tuple  # ({"id", "reason"}, ...)
    prompt_tokens: int  # of served requests
    output_tokens: int
    elapsed_s: float  # first step to last, on rank 0
    steps: int
    layout_steps: dict  # layout -> steps run in it
    step_ms: tuple  # wall time of every step on rank 0
    switches: tuple[SwitchSummary, ...]
    decisions: dict  # policy action -> steps
    check: dict | None  # reference_check.CheckResult as a dict; None when skipped
    load: dict = dataclasses.field(default_factory=dict)  # model build: seconds, bytes read, memory per part (rank 0)
    outputs: tuple = ()  # ({"id", "prompt_token_ids", "token_ids", "finish_reason"}, ...) of requests given by prompt
    step_rows: tuple = ()  # query rows of every step
    step_requests: tuple = ()  # requests in every step
    latency: dict = dataclasses.field(default_factory=dict)  # ttft_ms / itl_ms / e2e_ms: :func:`latency`
    precopies: tuple = ()  # every pre-copy begun (PreCopyRecord as a dict), in order
    precopy_counts: dict = dataclasses.field(default_factory=dict)  # begun, handed_off, cancelled, fell_back
    # steps by how rank 0 booked them: "ahead" (the next step planned while the device ran this one), or
    # why the host waited for the step's tokens first (controller.StepRecord.booked)
    booked: dict = dataclasses.field(default_factory=dict)
    # device time of every step on rank 0 (StepRecord.device_seconds; None where not measured)
    step_device_ms: tuple = ()

    @property
    def tokens_per_s(self) -> float:
        """The paper's total throughput: (input + output tokens of served requests) / time."""
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def done_switches(self) -> list[SwitchSummary]:
        return [s for s in self.switches if not s.refused]

    @property
    def check_passed(self) -> bool | None:
        return None if self.check is None else bool(self.check["passed"])

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        steps = list(self.step_ms)
        out.update(tokens_per_s=self.tokens_per_s, output_tokens_per_s=self.output_tokens_per_s,
                   step_ms_p50=percentile(steps, 50) if steps else None,
                   step_ms_p95=percentile(steps, 95) if steps else None,
                   switch_count=len(self.done_switches))
        for s, d in zip(self.switches, out["switches"]):
            d.update(bytes_total=s.bytes_total, kind=s.kind)
        return out


def render(s: RunSummary) -> str:
    """The readable summary ``splash run`` prints."""
    lines = [f"{s.deployment}: {s.model} ({s.layers} layers), T = {s.T} on {s.device} ({s.backend}), "
             f"{s.compute_dtype}; workload {s.workload}; policy {s.policy}",
             f"KV pool: {s.kv_pages:,} pages per layer and rank ({s.kv_pages_source}); "
             f"prefill chunk {s.prefill_chunk} rows per owner rank"]
    if s.load:
        lines.append(load_line(s.load))
        if s.load.get("graphs"):
            lines.append(s.load["graphs"]["line"])
        if s.load.get("moe_dispatch"):
            lines.append(s.load["moe_dispatch"]["line"])
    lines.append("")
    lines += table(_overview_rows(s), ["", ""], align="ll").splitlines()[2:]
    lines += _switch_lines(s)
    for r in s.rejected:
        lines.append(f"rejected request {r['id']}: {r['reason']}")
    lines.append("")
    lines.append(_check_line(s.check))
    return "\n".join(lines)


def _overview_rows(s: RunSummary) -> list[tuple[str, str]]:
    """The (label, value) rows of the summary's table."""
    rows = [("requests served", f"{s.served} of {s.requests}" + (f" ({len(s.rejected)} rejected)" if s.rejected else "")),
            ("tokens", f"{s.prompt_tokens:,} prompt + {s.output_tokens:,} generated"),
            ("time", f"{number(s.elapsed_s)} s, {s.steps} steps"
                     + (f" (p50 {number(percentile(list(s.step_ms), 50))} ms per step)" if s.step_ms else "")),
            ("throughput", f"{number(s.tokens_per_s)} tokens/s total, {number(s.output_tokens_per_s)} generated tokens/s"),
            ("latency", latency_line(s.latency)),
            ("steps per layout", ", ".join(f"{k} {v}" for k, v in s.layout_steps.items()) or "none"),
            ("host", booked_line(s.booked)),
            ("switches", str(len(s.done_switches)) + (f" ({len(s.switches) - len(s.done_switches)} refused)"
                                                      if len(s.switches) > len(s.done_switches) else ""))]
    if s.precopies:
        rows.append(("pre-copies", precopy_line(s.precopy_counts)))
    return rows


def _switch_lines(s: RunSummary) -> list[str]:
    """The switches made (a table), the pre-copies cancelled and the switches refused."""
    lines = []
    if s.done_switches:
        lines += ["", table([(w.step, f"{w.src} -> {w.dst}", w.how(), w.bytes_total / MIB, w.exposed_ms, w.step_ms,
                              w.reason) for w in s.done_switches],
                            ["step", "switch", "how", "MiB moved", "exposed ms", "step ms", "why"], align="rllrrrl")]
    for p in s.precopies:
        if p["outcome"] == "cancelled":
            lines.append(f"pre-copy {p['src']} -> {p['dst']} from step {p['begun']} cancelled at step {p['ended']} "
                         f"after {p['steps_run']} of {p['steps']} steps ({p['bytes'] / MIB:.2f} MiB copied): {p['why']}")
    refusals: dict[tuple, list[int]] = {}
    for w in s.switches:
        if w.refused:
            refusals.setdefault((w.src, w.dst, w.refused), []).append(w.step)
    for (src, dst, why), steps in refusals.items():
        times = f"{len(steps)} times from step {steps[0]}" if len(steps) > 1 else f"at step {steps[0]}"
        lines.append(f"switch {src} -> {dst} refused {times}: {why}")
    return lines


def _check_line(check: dict | None) -> str:
    if check is None:
        return "reference check: skipped (--no-check)"
    if not check["requests"]:
        return "reference check: not done, " + check["line"]
    return ("reference check: passed, " if check["passed"] else "reference check: FAILED, ") + check["line"]


def booked_line(booked: dict) -> str:
    """``712 steps planned while the device ran the step before; waited for the tokens of 39 (switch 2, precopy 37)``."""
    ahead = booked.get("ahead", 0)
    waits = {k: v for k, v in booked.items() if k != "ahead"}
    line = f"{ahead} steps planned while the device ran the step before"
    if waits:
        line += (f"; waited for the tokens of {sum(waits.values())} first ("
                 + ", ".join(f"{k} {v}" for k, v in sorted(waits.items())) + ")")
    return line


def precopy_counts(records) -> dict:
    """{begun, handed_off, cancelled, fell_back} of pre-copy ``records``
    (:class:`~splash_core.engine.precopies.PreCopyRecord`)."""
    return {"begun": len(records), **{k: sum(r.outcome == k for r in records)
                                      for k in ("handed_off", "cancelled", "fell_back")}}


def precopy_line(counts: dict) -> str:
    """``3 begun: 1 handed off, 1 cancelled, 1 fell back to one step``."""
    return (f"{counts.get('begun', 0)} begun: {counts.get('handed_off', 0)} handed off, "
            f"{counts.get('cancelled', 0)} cancelled, {counts.get('fell_back', 0)} fell back to one step")


def latency_line(stats: dict) -> str:
    """``TTFT p50 12.3 / p99 45.6 ms, inter-token ..., end-to-end ...`` (or "none measured")."""
    parts = []
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "inter-token"), ("e2e_ms", "end-to-end")):
        d = stats.get(key) or {}
        if d.get("count"):
            parts.append(f"{name} p50 {number(d['p50'])} / p99 {number(d['p99'])} ms")
    return ", ".join(parts) or "none measured"


def load_line(load: dict) -> str:
    """One line on how the model was built: from where, how fast, what rank 0 holds."""
    memory = load.get("memory", {})
    held = ", ".join(f"{k} {v / MIB:,.1f}" for k, v in memory.items() if v)
    if load.get("source") == "checkpoint":
        where = (f"weights from {load['checkpoint']}: {load['bytes_read'] / MIB:,.1f} MiB read in "
                 f"{load['seconds']:.2f} s ({load['gb_per_s']:.2f} GB/s)")
    else:
        where = f"weights drawn from the deployment's seed in {load.get('seconds', 0.0):.2f} s"
    fmt = f"; {load['format']}" if load.get("format") else ""
    return f"model: {where}, held in {load.get('dtype', '')}{fmt}; rank 0 holds MiB: {held}"
