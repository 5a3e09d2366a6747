"""``splash calibrate``'s runtime measurement: the cost model's host term measured on this
machine's own runtime (paper §4.2: θ is calibrated once per deployment from microbenchmarks),
as that runtime serves: decode steps replayed from captured graphs where the backend captures
them (``--graphs``), prefill chunks eagerly, the backend's fused small ops.

On the group calibrate already runs, :func:`time_steps` times steps of a small runtime
:class:`~splash_core.runtime.model.Model` (:func:`splash_core.runtime.step_timing.time_layout`,
which ``bench/runtime_step.py`` times steps with too): the first few layers of a model profile
in each layout at two contexts, one decode step and one prefill chunk each, and the same model
with no layers at all (embedding and LM head), which is t0. :func:`fit_theta` turns them into
points beside Eq 10's device time under the θ measured in the same run and fits

- from the steps that ran eagerly (prefill, and decode where nothing replays): h_ℓ and η_h
  (:func:`splash_core.planning.host_overhead.fit_host_overheads`);
- from the replayed decode steps, timed at two layer counts: their own t0 and time per layer
  beyond Eq 10 (:func:`splash_core.planning.host_overhead.fit_replayed`), so no eager host time is
  charged to steps that have none.

The layers carry everything a layer of the runtime does that Eq 10 leaves out — kernel
launches, Python, synchronisation — so the numbers describe this runtime on this machine;
re-run calibration when either changes.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from ..dtypes import torch_dtype
from ..layouts import LAYOUTS, Layout
from ..planning import host_overhead
from ..planning.costmodel import CostModel
from ..profiles.deployment import SchedulerConfig
from ..profiles.hardware import HardwareProfile, StepSample
from ..profiles.loader import load
from ..profiles.model import ModelProfile
from ..runtime.step_timing import GRAPH_MODES, time_layout, timing_graphs


@dataclasses.dataclass(frozen=True)
class RuntimeSpec:
    """What to time: ``layers`` layers of model profile ``model``, ``batch`` requests at each of
    ``contexts`` (short, so the host dominates, and one longer, so host and device time can be
    told apart), a decode step and a ``prefill_chunk``-row chunk per request, ``reps`` timed steps
    after ``warmup``. ``graphs``: whether decode steps replay captured graphs (``auto``: where
    the backend captures them; ``on``: it must; ``off``: never); replayed decode steps are also
    timed at ``short_layers`` layers, which tells their t0 from their time per layer."""

    model: str
    layers: int
    batch: int
    contexts: tuple[int, int]
    page_size: int
    reps: int
    warmup: int
    graphs: str = "auto"
    prefill_chunk: int = 16
    short_layers: int = 1

    @classmethod
    def choose(cls, accelerator: bool, quick: bool, model: str | None = None,
               layers: int | None = None, graphs: str = "auto") -> "RuntimeSpec":
        """DeepSeek-V3 dims on an accelerator (B = 16 at 1K and 64K: the longer context adds about
        0.7 ms of Eq 10 device time per decode layer, enough to tell whether host time hides it);
        tiny-mla on the host (B = 4 at 64 and 8K: several ms of device time per layer at the longer
        context, above the noise of a shared CPU)."""
        if graphs not in GRAPH_MODES:
            raise ValueError(f"--graphs must be one of {', '.join(GRAPH_MODES)} (got {graphs!r})")
        if accelerator:
            spec = cls(model or "deepseek-v3", layers or 4, 16, (1024, 65536), 64, 5 if quick else 10, 2, graphs=graphs)
        else:
            spec = cls(model or "tiny-mla", layers or 3, 4, (64, 8192), 16, 3 if quick else 9, 2, graphs=graphs,
                       prefill_chunk=8)
        profile = load("model", spec.model)
        kinds = set(profile.layer_kinds[:spec.layers])
        if spec.layers < 1 or spec.layers > profile.num_layers:
            raise ValueError(f"--layers must be in 1..{profile.num_layers} for model {spec.model!r} (got {spec.layers})")
        if accelerator and graphs != "off" and spec.layers <= spec.short_layers:
            raise ValueError(f"--layers must exceed {spec.short_layers} where decode steps replay graphs: they are "
                             f"timed at {spec.short_layers} and --layers layers (got {spec.layers})")
        if len(kinds) != 1:
            raise ValueError(f"the first {spec.layers} layers of {spec.model!r} mix layer kinds "
                             f"({', '.join(sorted(k.value for k in kinds))}); calibrate on layers of one kind")
        return spec

    def describe(self, dtype: str) -> str:
        return (f"{self.layers} layers of {self.model}, {self.batch} requests x {self.contexts[0]} and "
                f"{self.contexts[1]} tokens (decode, and prefill chunks of {self.prefill_chunk} rows), {dtype}, "
                f"slowest rank's median of {self.reps}")


def runtime_model(spec: RuntimeSpec) -> ModelProfile:
    """The model the timed runtime builds: seeded weights stand a dense MLP in for routed experts."""
    profile = load("model", spec.model)
    return profile if profile.runtime_experts else dataclasses.replace(profile, moe=None)


def time_steps(ctx, spec: RuntimeSpec, dtype: str) -> list[dict]:
    """On every rank: median step time (the slowest rank's, per repetition) of the model
    without layers (decode) and of ``spec.layers`` layers in each layout (decode and prefill),
    at each context; where decode steps replay graphs, those again at ``spec.short_layers``
    layers, and decode steps at ``spec.layers`` eagerly too (with prefill chunks alone, which
    are device-bound at the longer context, η_h and h_ℓ would be one number).
    Returns the same list on every rank: dicts with the fields of
    :class:`~splash_core.profiles.hardware.StepSample`."""
    compute = torch_dtype(dtype)
    torch.set_float32_matmul_precision("high")  # as serving would run float32 matmuls
    graphs, graph_ops = timing_graphs(ctx, spec.graphs)
    common = dict(profile=load("model", spec.model), batch=spec.batch, page_size=spec.page_size, dtype=compute,
                  kernels=ctx.backend.mla_kernels(ctx.device, compute), reps=spec.reps, warmup=spec.warmup,
                  prefill_chunk=spec.prefill_chunk, fused=ctx.backend.fused_kernels(ctx.device, compute))
    replay = dict(graphs=graphs, graph_ops=graph_ops)
    eager = dict(graphs=None, graph_ops=None)
    runs = [(LAYOUTS[0], 0, ("decode",), eager)] + [(layout, spec.layers, ("decode", "prefill"), replay)
                                                    for layout in LAYOUTS]
    if graph_ops is not None:  # replayed decode at a second layer count; eager decode tells η_h from h_ℓ
        runs += [(layout, spec.short_layers, ("decode",), replay) for layout in LAYOUTS]
        runs += [(layout, spec.layers, ("decode",), eager) for layout in LAYOUTS]
    samples = []
    for layout, layers, phases, how in runs:
        mine = time_layout(ctx, layout=layout, layers=layers, contexts=list(spec.contexts), phases=phases, **how,
                           **common)
        everyone = ctx.collectives.all_gather_object(mine)  # a step ends on its slowest rank
        for i, sample in enumerate(mine):
            slowest = [max(rank[i]["step_ms"][k] for rank in everyone) for k in range(len(sample["step_ms"]))]
            samples.append({"layout": str(layout), "layers": layers, "batch": spec.batch,
                            "context": sample["context"], "seconds": statistics.median(slowest) / 1e3,
                            "phase": sample["phase"], "rows": sample["rows"] // spec.batch, "path": sample["path"]})
    return samples


def fit_theta(samples: list[dict], hardware: HardwareProfile, spec: RuntimeSpec, T: int, dtype: str) -> dict:
    """The host-term keys of θ (``step_overhead_us``, ``layer_overhead_us`` per layout,
    ``host_overlap``, ``step_samples``; and where decode steps replayed graphs,
    ``graph_step_overhead_us`` and ``graph_layer_overhead_us``) from :func:`time_steps`'
    samples, with ``methods`` (key -> how it was measured) for the profile's ``ref`` fields.
    ``hardware`` holds the θ measured in the same run; its own host term, if any, is ignored."""
    steps = [StepSample(**s) for s in samples]
    t0 = statistics.median(s.seconds for s in steps if s.layers == 0)
    model, device_theta = runtime_model(spec), hardware.without_host_overheads()

    def cost_model(layers: int) -> CostModel:  # sparse=False: the runtime attends to every key (no top-k)
        return CostModel(model, device_theta, T, page_size=spec.page_size, compute_dtype=dtype,
                         overlap=SchedulerConfig().overlap, layers=range(layers), sparse=False)

    eager = [s for s in steps if s.layers and s.path != "replay"]
    points = host_overhead.layer_points(cost_model(spec.layers), eager, t0)
    fit = host_overhead.fit_host_overheads(points)
    rms_us = host_overhead.rms_residual(points, fit) * 1e6
    where = f"on {T} rank(s)"
    caveats = "".join(f"; {note}" for note in fit.notes)
    eager_what = ("prefill chunks and eagerly run decode steps" if any(s.path == "replay" for s in steps)
                  else "decode steps and prefill chunks")
    out = {
        "step_overhead_us": t0 * 1e6,
        "layer_overhead_us": {str(layout): h * 1e6 for layout, h in fit.layer_s.items()},
        "host_overlap": fit.host_overlap,
        "step_samples": samples,
        "methods": {
            "step_overhead_us": f"decode step of the embedding and LM head alone ({spec.model}, {spec.batch} "
                                f"requests, {dtype}, {where}), slowest rank's median of {spec.reps}, median "
                                f"over both contexts",
            "layer_overhead_us": f"host time per layer of eagerly run steps, fitted to the {eager_what} of "
                                 f"{spec.describe(dtype)}, {where}, beside Eq 10's device time under this profile's "
                                 f"theta (step_samples); rms residual {rms_us:.1f} us per layer{caveats}",
            "host_overlap": f"least-squares fit (grid of 0.01) to the same steps as layer_overhead_us{caveats}",
        },
    }
    replayed = [s for s in steps if s.path == "replay"]
    if replayed:
        graph = _fit_replayed(replayed, cost_model, spec, where, dtype)
        out.update({**graph, "methods": {**out["methods"], **graph["methods"]}})
    return out


def _fit_replayed(replayed: list[StepSample], cost_model, spec: RuntimeSpec, where: str, dtype: str) -> dict:
    """The replayed decode steps' t0 and time per layer beyond Eq 10 (µs), with their methods."""
    points = []
    for s in replayed:
        cost, layout = cost_model(s.layers), Layout(s.layout)
        x = host_overhead.uniform_batch(s.batch, s.context, cost.T)
        device = s.layers * host_overhead.device_layer_time(cost, x, layout) + cost.evaluate(x).step_time(layout).ffn_s
        points.append(host_overhead.ReplayPoint(layout, s.layers, s.seconds - device))
    fit = host_overhead.fit_replayed(points)
    caveats = "".join(f"; {note}" for note in fit.notes)
    what = (f"decode steps replayed from captured graphs, {spec.short_layers} and {spec.layers} layers of "
            f"{spec.model}, {spec.batch} requests x {spec.contexts[0]} and {spec.contexts[1]} tokens, {dtype}, {where}, "
            f"slowest rank's median of {spec.reps}, beside Eq 10's device time (step_samples with path replay)")
    return {
        "graph_step_overhead_us": fit.step_s * 1e6,
        "graph_layer_overhead_us": {str(layout): g * 1e6 for layout, g in fit.layer_s.items()},
        "methods": {"graph_step_overhead_us": f"t0 of a least-squares line t - Eq 10 = t0 + L g_l through the {what}"
                                              f"{caveats}",
                    "graph_layer_overhead_us": f"g_l of the same line (per layout){caveats}"},
    }
