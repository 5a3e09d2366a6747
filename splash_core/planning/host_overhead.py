"""The cost model's host term fitted to timed runtime steps (pure; no torch.distributed).

The cost model (:mod:`splash_core.planning.costmodel`) charges every layer of layout ℓ its Eq 10
device time d plus the host time that does not hide behind it, [h_ℓ − η_h d]+; a step adds
t0. A decode step of L layers timed at one batch is therefore

    t = t0 + L · (d + [h_ℓ − η_h d]+),

so each timed configuration gives one point (d, m) with m = (t − t0 − t_ffn) / L its time per
layer (t_ffn: the shared dense/MoE blocks' device time, which the cost model charges apart).
:func:`fit_host_overheads` finds the h_ℓ per layout and the one η_h of the machine that
minimise the squared error of m over all points: η_h on a grid of [0, 1], and for each η_h
every layout's h_ℓ exactly (the error is piecewise quadratic in h_ℓ: each point's term starts
to count once h_ℓ passes η_h d). Where the host is the bottleneck (h_ℓ ≥ η_h d at every
point) this is the linear least squares of m = h_ℓ + (1 − η_h) d; where the device is, a
point says nothing about h_ℓ, and the fit does not pretend it does.

η_h needs points of one layout at two contexts whose device times differ; given η_h, one
context per layout is enough. A layout whose timed steps ran faster than Eq 10's device time
gets h_ℓ = 0 and a note: Eq 10 alone over-predicts it.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Iterable, Sequence

import numpy as np

from ..layouts import LAYOUTS, Layout
from .costmodel import BatchArrays, CostModel

ETA_GRID = tuple(i / 100 for i in range(101))  # η_h candidates: a 1% grid of [0, 1]


@dataclasses.dataclass(frozen=True)
class LayerPoint:
    """One timed configuration reduced to one layer: measured and Eq 10's device time, seconds."""

    layout: Layout
    context: int
    measured_s: float  # (step − t0 − shared blocks) / layers
    device_s: float  # Eq 10's t_dev of one layer at the same batch, host term left out


@dataclasses.dataclass(frozen=True)
class HostFit:
    """Fitted host term: h per layout (seconds), η_h, and caveats of the fit (in words)."""

    layer_s: dict[Layout, float]
    host_overlap: float
    notes: tuple[str, ...] = ()


def uniform_batch(batch: int, context: int, T: int, query_rows: int = 1) -> BatchArrays:
    """``batch`` requests of ``context`` tokens (this step's rows included), owners i mod T,
    ids 0..B−1: the batch :func:`splash_core.runtime.step_bench.measure_layout` times."""
    return BatchArrays.of([context] * batch, np.arange(batch) % T, query_rows=[query_rows] * batch)


def device_layer_time(cost: CostModel, x: BatchArrays, layout: Layout) -> float:
    """Eq 10's time of one layer of ``layout`` (the model's only layer kind), host term excluded."""
    kinds = {kc.kind for kc in cost.kinds}
    if len(kinds) != 1:
        raise ValueError(f"host overheads are fitted on a model of one layer kind (got {sorted(k.value for k in kinds)})")
    if cost.host_list != [0.0] * len(LAYOUTS) or cost.replays:
        raise ValueError("device_layer_time needs a cost model without host overheads "
                         "(HardwareProfile.without_host_overheads)")
    (kind,) = kinds
    return float(cost.evaluate(x).layer_s[kind][LAYOUTS.index(layout)])


def layer_point(cost: CostModel, layout: Layout, layers: int, batch: int, context: int, seconds: float,
                t0_s: float, rows: int = 1) -> LayerPoint:
    """One timed step of ``layers`` layers (``rows`` query rows per request: 1 in decode) reduced
    to one layer, beside Eq 10's device time."""
    x = uniform_batch(batch, context, cost.T, query_rows=rows)
    shared = cost.evaluate(x).step_time(layout).ffn_s
    return LayerPoint(layout, context, (seconds - t0_s - shared) / layers, device_layer_time(cost, x, layout))


def layer_points(cost: CostModel, samples: Iterable, t0_s: float) -> list[LayerPoint]:
    """Per timed sample with layers > 0 (objects with layout, layers, batch, context, seconds and
    optionally rows): its per-layer time beside Eq 10's device time from ``cost``."""
    return [layer_point(cost, Layout(s.layout), s.layers, s.batch, s.context, s.seconds, t0_s,
                        getattr(s, "rows", 1)) for s in samples if s.layers]


@dataclasses.dataclass(frozen=True)
class ReplayPoint:
    """One timed decode step replayed from captured graphs, less Eq 10's device time of its
    layers and shared blocks: ``residual_s`` = t − t_ffn − L·t_dev, seconds."""

    layout: Layout
    layers: int
    residual_s: float


@dataclasses.dataclass(frozen=True)
class ReplayFit:
    """Replayed decode steps' t0 and time per layer beyond Eq 10 (seconds), with caveats."""

    step_s: float
    layer_s: dict[Layout, float]
    notes: tuple[str, ...] = ()


ROUNDING_S = 1e-9  # a fitted time closer to 0 than this is 0 (least squares' rounding, not a finding)


def fit_replayed(points: Sequence[ReplayPoint]) -> ReplayFit:
    """t0 and g_ℓ of residual = t0 + L·g_ℓ by least squares over ``points`` (a replayed graph
    spends no host time per layer, so what Eq 10 leaves out adds: no overlap term). Needs two
    layer counts of one layout (else t0 and g_ℓ are one number); both are kept >= 0."""
    by_layout = {l: [p for p in points if p.layout is l] for l in LAYOUTS}
    missing = [str(l) for l, mine in by_layout.items() if not mine]
    if missing:
        raise ValueError(f"no replayed steps in layout {', '.join(missing)}: every layout needs its time per layer")
    if not any(len({p.layers for p in mine}) > 1 for mine in by_layout.values()):
        raise ValueError("fitting a replayed step's t0 needs two layer counts of one layout")
    a = np.array([[1.0] + [float(p.layers) * (p.layout is l) for l in LAYOUTS] for p in points])
    y = np.array([p.residual_s for p in points])
    coef = np.linalg.lstsq(a, y, rcond=None)[0]
    notes = []
    if coef[0] < -ROUNDING_S:  # the shortest steps ran faster than Eq 10 says: no negative t0
        notes.append(f"t0 fitted below 0 ({coef[0] * 1e6:.0f} us): 0, time per layer refitted")
        coef = np.concatenate([[0.0], [max(0.0, statistics.fmean(p.residual_s / p.layers for p in by_layout[l]))
                                       for l in LAYOUTS]])
    layer_s = {}
    coef[0] = max(0.0, coef[0])  # a t0 within rounding of 0 (least squares may land a hair below it)
    for layout, g in zip(LAYOUTS, coef[1:]):
        if g < -ROUNDING_S:
            notes.append(f"{layout}: 0 us per layer (Eq 10 alone over-predicts its replayed steps)")
        layer_s[layout] = max(0.0, float(g))
    return ReplayFit(float(coef[0]), layer_s, tuple(notes))


def _sse(points: Sequence[LayerPoint], h: float, eta: float) -> float:
    return sum((p.measured_s - p.device_s - max(0.0, h - eta * p.device_s)) ** 2 for p in points)


def _best_host(points: Sequence[LayerPoint], eta: float) -> tuple[float, float]:
    """(h, squared error): the h ≥ 0 that fits one layout's points best at this η_h (the
    smallest such h on ties). Between consecutive breakpoints η_h d the active points are
    fixed and the optimum is their mean of m − (1 − η_h) d; the breakpoints and 0 are the
    other candidates."""
    starts = sorted({eta * p.device_s for p in points})
    edges = [0.0] + [a for a in starts if a > 0.0] + [float("inf")]
    candidates = set(edges[:-1])
    for lo, hi in zip(edges, edges[1:]):
        active = [p for p in points if eta * p.device_s <= lo]
        if active:
            h = statistics.fmean(p.measured_s - (1.0 - eta) * p.device_s for p in active)
            candidates.add(min(max(h, lo), hi))
    return min(((_sse(points, h, eta), h) for h in sorted(candidates)))[::-1]


def fit_host_overheads(points: Sequence[LayerPoint], host_overlap: float | None = None) -> HostFit:
    """h_ℓ for every layout and (unless given) η_h, by least squares over ``points``."""
    by_layout = {l: [p for p in points if p.layout is l] for l in LAYOUTS}
    missing = [str(l) for l, mine in by_layout.items() if not mine]
    if missing:
        raise ValueError(f"no timed steps in layout {', '.join(missing)}: every layout needs its overhead")
    notes = []
    if host_overlap is None:
        if not any(len({p.device_s for p in mine}) > 1 for mine in by_layout.values()):
            raise ValueError("fitting host_overlap needs two contexts of one layout whose device times differ")
        errors = [(sum(_best_host(mine, eta)[1] for mine in by_layout.values()), eta) for eta in ETA_GRID]
        best_error, host_overlap = min(errors)
        if max(e for e, _ in errors) - best_error <= 1e-9 * max(best_error, 1e-30):
            notes.append("host_overlap is not identifiable from these points (every value fits alike)")
    layer_s = {}
    for layout, mine in by_layout.items():
        h, _ = _best_host(mine, host_overlap)
        if h == 0.0 and any(p.measured_s < p.device_s for p in mine):
            notes.append(f"{layout}: 0 us per layer (Eq 10 alone over-predicts its timed steps)")
        layer_s[layout] = h
    return HostFit(layer_s, host_overlap, tuple(notes))


def rms_residual(points: Sequence[LayerPoint], fit: HostFit) -> float:
    """Root-mean-square error of the fitted model over ``points``, seconds per layer."""
    return (sum(_sse([p], fit.layer_s[p.layout], fit.host_overlap) for p in points) / len(points)) ** 0.5
