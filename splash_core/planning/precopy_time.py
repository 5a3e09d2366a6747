"""Eq 7 extended to switches that span steps: a one-step switch against a pre-copy of k steps
(issue 26; :mod:`splash_core.runtime.switch.precopy` executes it).

A one-step switch exposes Eq 7 on its whole manifest. A pre-copy of k steps costs

- the handoff's Eq 7 on the dirty tails only (the manifest with the copied prefixes held:
  :func:`~splash_core.planning.manifest.plan_switch`'s ``copied``), the weights and the recurrent state;
- per pre-copy step, the background copy of 1/k of the prefixes: what of it outlasts the step
  it runs beside is exposed, and what it overlaps slows that step by the interference
  coefficient α (the fraction of the overlapped copy time a step loses to it: the memory
  bandwidth and copy engines it shares), ``k · ([c/k − t_src]+ + α · min(c/k, t_src))``;
- the k steps run in the source layout instead of the faster destination: ``k · [t_src − t_dst]+``.

α is a calibratable value of the deployment (``scheduler.precopy_interference``). Its default,
0.48, is what one H200 lost to a layer's page copies (pack/unpack kernels, 16 and 64 MiB) beside
each layer of a B = 16, 128K decode step, where pre-copies run
(``bench/results/h200/copy_interference-decode.json`` through :func:`interference_from_probe`);
beside a 128K prefill step the same probe gives 0.75 (``copy_interference.json``: 0.74-0.79 by
memcpy, 0.83-0.84 by pulls). On CPU (gloo threads beside the step) it says little about a device. The prefix copy time ``c`` is the one-step manifest's
transfer time less the handoff's, layer by layer (what the pre-copy takes off the handoff).
Everything here is pure: manifests in, seconds out.
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np

from .switch_time import SwitchCost, layer_transfer_times, switch_cost

ONE_STEP, PRECOPY = "one_step", "precopy"


@dataclasses.dataclass(frozen=True)
class TransitionCost:
    """What one way of switching costs beyond running the destination layout (seconds)."""

    kind: str  # one_step or precopy
    steps: int  # pre-copy steps before the handoff (0 for one step)
    exposed_s: float  # Eq 7 of the switching step (the handoff's: dirty tails only)
    background_s: float  # the pre-copy steps' exposed copy time and interference
    delay_s: float  # the pre-copy steps run in the source layout instead of the destination
    recapture_s: float = 0.0  # of exposed_s: capturing the destination's decode graph again

    def _recapture(self) -> str:
        return f", {self.recapture_s * 1e3:.3f} ms of it re-capturing decode graphs" if self.recapture_s else ""

    @property
    def total_s(self) -> float:
        return self.exposed_s + self.background_s + self.delay_s

    def explain(self) -> str:
        if self.kind == ONE_STEP:
            return f"one-step switch: {self.exposed_s * 1e3:.3f} ms exposed (Eq 7{self._recapture()})"
        return (f"pre-copy of {self.steps} steps: handoff {self.exposed_s * 1e3:.3f} ms exposed{self._recapture()}, background "
                f"{self.background_s * 1e3:.3f} ms, {self.delay_s * 1e3:.3f} ms more in the source layout; "
                f"{self.total_s * 1e3:.3f} ms in all")


def precopy_cost(handoff: SwitchCost, prefix_s: float, steps: int, src_step_s: float, dst_step_s: float,
                 interference: float) -> TransitionCost:
    """The pre-copy of ``steps`` steps whose prefix copy takes ``prefix_s`` in all, handing off
    with ``handoff`` (Eq 7 of the dirty tails); see the module docstring."""
    if steps < 1:
        raise ValueError(f"a pre-copy spans at least one step (got {steps})")
    if not 0.0 <= interference <= 1.0:
        raise ValueError(f"the interference coefficient must be in [0, 1] (got {interference})")
    per_step = max(prefix_s, 0.0) / steps
    background = steps * (max(per_step - src_step_s, 0.0) + interference * min(per_step, src_step_s))
    return TransitionCost(PRECOPY, steps, handoff.exposed_s, background, steps * max(src_step_s - dst_step_s, 0.0),
                          handoff.recapture_s)


def choose_transition(one_step_manifest, candidates: dict, cost_model, dest, src_step_s: float,
                      interference: float, x=None) -> tuple[TransitionCost, tuple[TransitionCost, ...]]:
    """The cheapest way to switch (ties go to fewer steps, so to the one-step switch), and every
    candidate costed: the one-step switch of ``one_step_manifest`` and, per k of ``candidates``
    (k -> (one-step manifest, handoff manifest), both planned on the histories k steps on, the
    handoff's with the prefixes held), the pre-copy of k steps. ``dest``: the destination
    layout's :class:`~splash_core.planning.costmodel.StepTime`. ``x``: the batch, for the re-capture of
    decode graphs a switch that moves weights needs (the one-step switch and every handoff alike)."""
    one = switch_cost(one_step_manifest, cost_model, dest, x)
    costs = [TransitionCost(ONE_STEP, 0, one.exposed_s, 0.0, 0.0, one.recapture_s)]
    for k, (whole, handoff) in sorted(candidates.items()):
        prefix = float(np.maximum(layer_transfer_times(whole, cost_model)
                                  - layer_transfer_times(handoff, cost_model), 0.0).sum())
        costs.append(precopy_cost(switch_cost(handoff, cost_model, dest, x), prefix, k, src_step_s, dest.total_s,
                                  interference))
    best = min(costs, key=lambda c: (c.total_s, c.steps))
    return best, tuple(costs)


def candidate_steps(max_steps: int) -> tuple[int, ...]:
    """The pre-copy lengths worth costing up to ``max_steps``: powers of two, and the limit."""
    out, k = [], 1
    while k < max_steps:
        out.append(k)
        k *= 2
    return tuple(out) + (max_steps,) if max_steps >= 1 else ()


def plan_transition(x, src, dst, cost_model, estimates, max_steps: int, interference: float, layers=None):
    """:func:`choose_transition` for the scheduler's batch ``x`` (a
    :class:`~splash_core.planning.costmodel.BatchArrays`, contexts including this step's rows) switching
    ``src → dst`` with pre-copies of up to ``max_steps`` steps: each request's prefix is its
    history's full pages before this step, and k steps on every request has grown by k times its
    rows this step. ``estimates``: Eq 10 of ``x`` (the source and destination step times)."""
    from .manifest import plan_switch  # the planner imports the cost model's loads
    from .ownership import Batch, Request

    page, T, model = cost_model.page_size, cost_model.T, cost_model.model
    rows = np.asarray(x.query_rows, dtype=np.int64)
    contexts = np.asarray(x.contexts, dtype=np.int64)
    copied = (contexts - rows) // page
    now = x.to_batch()

    def grown(k: int) -> Batch:
        return Batch(tuple(Request(r.id, r.context + k * r.query_rows, r.owner, r.query_rows) for r in now.requests))

    one_step = plan_switch(src, dst, now, model, T, page, layers=layers)
    candidates = {}
    for k in candidate_steps(max_steps):
        later = grown(k)
        candidates[k] = (plan_switch(src, dst, later, model, T, page, layers=layers),
                         plan_switch(src, dst, later, model, T, page, layers=layers, copied=copied))
    return choose_transition(one_step, candidates, cost_model, estimates.step_time(dst),
                             estimates.step_time(src).total_s, interference, x)


def interference_from_probe(rows, layers: int, variant: str = "kernels") -> float:
    """α from ``bench/copy_interference.py``'s summary rows, whose step computes each of its
    ``layers`` layers beside one layer's copies of the ``variant`` kind (overlapping all of them):
    the step's slowdown over the copies' own time, the median over the sizes probed."""
    mine = [r for r in rows if r["variant"] == variant and r["copy_alone_ms"] > 0]
    if not mine:
        raise ValueError(f"no {variant!r} rows with a copy time in the probe's results")
    return float(statistics.median(max(r["slowdown_ms"], 0.0) / (layers * r["copy_alone_ms"]) for r in mine))
