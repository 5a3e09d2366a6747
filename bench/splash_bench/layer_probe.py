"""Where an untraced step's time goes, layer by layer (issue 5's diagnosis without a profiler).

A profiler adds host time to every launch, so a traced switching step is host-bound even when
the real one is not. :class:`LayerProbe` instead observes a switch executor's steps as its
tracer (``SwitchExecutor(..., tracer=probe)``) and, at each layer's boundary (around the
executor's work there, which lands the layer's state), records

- a compute-stream event before and after the executor's hook: the device time the layer
  waited for its transfer (``wait_ms``) and the time it then computed until the next boundary
  (``compute_ms``; the last layer's runs to the end of the step: lm head and logits gather);
- the host clock: how long the host took from this boundary to the next (``host_ms``);
- whether the compute stream had already drained when the host got there (``drained``): the
  device sat idle waiting for the host.

Events cost the same in every mode, so ready and SPLASH steps compare layer by layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import numpy as np

from splash_core.runtime.switch.tracing import SwitchTracer


@dataclasses.dataclass
class _Boundary:
    host_s: float
    drained: bool
    before: object  # compute-stream event before the executor's hook
    after: object  # and after it


@dataclasses.dataclass
class ProbedStep:
    """One probed step (times read once its events completed: after the executor's step)."""

    boundaries: list[_Boundary] = dataclasses.field(default_factory=list)
    end: object = None
    end_host_s: float = 0.0

    def span_ms(self) -> float:
        """Device time from the first layer's boundary to the end of the step."""
        return self.boundaries[0].before.elapsed_time(self.end)

    def layers(self) -> dict[str, list]:
        """Per layer: ``wait_ms``, ``compute_ms``, ``host_ms`` and ``drained`` (see the module)."""
        b = self.boundaries
        nxt = [x.before for x in b[1:]] + [self.end]
        host_next = [x.host_s for x in b[1:]] + [self.end_host_s]
        return {"wait_ms": [x.before.elapsed_time(x.after) for x in b],
                "compute_ms": [x.after.elapsed_time(n) for x, n in zip(b, nxt)],
                "host_ms": [(h - x.host_s) * 1e3 for x, h in zip(b, host_next)],
                "drained": [bool(x.drained) for x in b]}


class LayerProbe(SwitchTracer):
    """Records a :class:`ProbedStep` for every step of the executor it traces while ``active``."""

    def __init__(self, streams):
        self.streams, self.active = streams, True
        self.steps: list[ProbedStep] = []
        self._run: ProbedStep | None = None

    def _event(self):
        ev = self.streams.new_event(timing=True)
        ev.record()
        return ev

    @contextlib.contextmanager
    def layer(self, pos: int):
        if not self.active:
            yield
            return
        if pos == 0 or self._run is None:
            self._run = ProbedStep()
        host, drained = time.perf_counter(), self.streams.current_stream().query()
        before = self._event()
        yield
        self._run.boundaries.append(_Boundary(host, drained, before, self._event()))

    def step_end(self) -> None:
        if self._run is None:
            return
        self._run.end, self._run.end_host_s = self._event(), time.perf_counter()
        self.steps.append(self._run)
        self._run = None

    def take(self) -> list[ProbedStep]:
        """The steps probed so far, forgetting them."""
        out, self.steps = self.steps, []
        return out


def summarize(steps: list[ProbedStep]) -> dict:
    """Per layer, the median over ``steps`` of each quantity (``drained``: how many steps had
    drained there), and the totals of those medians."""
    if not steps:
        return {}
    per = [s.layers() for s in steps]
    out = {k: [float(np.median(v)) for v in zip(*(p[k] for p in per))] for k in ("wait_ms", "compute_ms", "host_ms")}
    out["drained"] = [int(sum(v)) for v in zip(*(p["drained"] for p in per))]
    out["totals"] = {"wait_ms": sum(out["wait_ms"]), "compute_ms": sum(out["compute_ms"]),
                     "host_ms": sum(out["host_ms"]), "drained_layers": sum(1 for d in out["drained"] if d),
                     "span_ms": float(np.median([s.span_ms() for s in steps]))}
    return out
