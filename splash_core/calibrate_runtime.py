"""``splash calibrate``'s runtime measurement: the cost model's host term (t0, h_ℓ per layout,
η_h) measured on this machine's own runtime (paper §4.2: θ is calibrated once per deployment
from microbenchmarks).

On the group calibrate already runs, :func:`time_steps` times decode steps of a small
runtime :class:`~splash_core.runtime.model.Model` (:func:`splash_core.runtime.step_timing.time_layout`,
which ``bench/runtime_step.py`` times steps with too): the first few layers of a model profile in each layout at two
contexts, and the same model with no layers at all (embedding and LM head), which is t0.
:func:`fit_theta` turns them into per-layer points beside Eq 10's device time under the θ
measured in the same run and fits h_ℓ and η_h (:mod:`splash_core.host_overhead`).

The layers carry everything a layer of the runtime does that Eq 10 leaves out — kernel
launches, Python, synchronisation, and the dense MLP the cost model does not model — so the
numbers describe this runtime on this machine; re-run calibration when either changes.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from . import host_overhead
from .costmodel import CostModel
from .layouts import LAYOUTS
from .profiles.deployment import SchedulerConfig
from .profiles.hardware import HardwareProfile, StepSample
from .dtypes import torch_dtype
from .profiles.loader import load
from .runtime.step_timing import time_layout


@dataclasses.dataclass(frozen=True)
class RuntimeSpec:
    """What to time: ``layers`` layers of model profile ``model``, ``batch`` requests at each of
    ``contexts`` (short, so the host dominates, and one longer, so host and device time can be
    told apart), ``reps`` timed steps after ``warmup``."""

    model: str
    layers: int
    batch: int
    contexts: tuple[int, int]
    page_size: int
    reps: int
    warmup: int

    @classmethod
    def choose(cls, accelerator: bool, quick: bool, model: str | None = None,
               layers: int | None = None) -> "RuntimeSpec":
        """DeepSeek-V3 dims on an accelerator (B = 16 at 1K and 64K: the longer context adds about
        0.7 ms of Eq 10 device time per TP layer, enough to tell whether host time hides it); tiny-mla
        on the host (B = 4 at 64 and 8K: several ms of device time per layer at the longer context, above
        the noise of a shared CPU)."""
        if accelerator:
            spec = cls(model or "deepseek-v3", layers or 4, 16, (1024, 65536), 64, 5 if quick else 10, 2)
        else:
            spec = cls(model or "tiny-mla", layers or 3, 4, (64, 8192), 16, 3 if quick else 9, 2)
        profile = load("model", spec.model)
        kinds = set(profile.layer_kinds[:spec.layers])
        if spec.layers < 1 or spec.layers > profile.num_layers:
            raise ValueError(f"--layers must be in 1..{profile.num_layers} for model {spec.model!r} (got {spec.layers})")
        if len(kinds) != 1:
            raise ValueError(f"the first {spec.layers} layers of {spec.model!r} mix layer kinds "
                             f"({', '.join(sorted(k.value for k in kinds))}); calibrate on layers of one kind")
        return spec

    def describe(self, dtype: str) -> str:
        return (f"{self.layers} layers of {self.model}, {self.batch} requests x {self.contexts[0]} and "
                f"{self.contexts[1]} tokens, {dtype}, slowest rank's median of {self.reps}")


def time_steps(ctx, spec: RuntimeSpec, dtype: str) -> list[dict]:
    """On every rank: median decode step time (the slowest rank's, per repetition) of the
    model without layers and of ``spec.layers`` layers in each layout, at each context.
    Returns the same list on every rank: dicts with the fields of
    :class:`~splash_core.profiles.hardware.StepSample`."""
    compute = torch_dtype(dtype)
    torch.set_float32_matmul_precision("high")  # as serving would run float32 matmuls
    common = dict(profile=load("model", spec.model), batch=spec.batch, page_size=spec.page_size, dtype=compute,
                  kernels=ctx.backend.mla_kernels(ctx.device, compute), reps=spec.reps, warmup=spec.warmup,
                  phases=("decode",))
    runs = [(LAYOUTS[0], 0, spec.contexts)] + [(layout, spec.layers, spec.contexts) for layout in LAYOUTS]
    samples = []
    for layout, layers, contexts in runs:
        mine = time_layout(ctx, layout=layout, layers=layers, contexts=list(contexts), **common)
        everyone = ctx.collectives.all_gather_object(mine)  # a step ends on its slowest rank
        for i, sample in enumerate(mine):
            slowest = [max(rank[i]["step_ms"][k] for rank in everyone) for k in range(len(sample["step_ms"]))]
            samples.append({"layout": str(layout), "layers": layers, "batch": spec.batch,
                            "context": sample["context"], "seconds": statistics.median(slowest) / 1e3})
    return samples


def fit_theta(samples: list[dict], hardware: HardwareProfile, spec: RuntimeSpec, T: int, dtype: str) -> dict:
    """The host-term keys of θ (``step_overhead_us``, ``layer_overhead_us`` per layout,
    ``host_overlap``, ``step_samples``) from :func:`time_steps`' samples, with ``methods``
    (key -> how it was measured) for the profile's ``ref`` fields. ``hardware`` holds the θ
    measured in the same run; its own host term, if any, is ignored."""
    steps = [StepSample(**s) for s in samples]
    t0 = statistics.median(s.seconds for s in steps if s.layers == 0)
    # sparse=False: the runtime attends to every key (it has no top-k attention)
    cost = CostModel(load("model", spec.model), hardware.without_host_overheads(), T, page_size=spec.page_size,
                     compute_dtype=dtype, overlap=SchedulerConfig().overlap, layers=range(spec.layers), sparse=False)
    points = host_overhead.layer_points(cost, steps, t0)
    fit = host_overhead.fit_host_overheads(points)
    rms_us = host_overhead.rms_residual(points, fit) * 1e6
    what = f"{spec.describe(dtype)}, on {T} rank(s)"
    caveats = "".join(f"; {note}" for note in fit.notes)
    return {
        "step_overhead_us": t0 * 1e6,
        "layer_overhead_us": {str(layout): h * 1e6 for layout, h in fit.layer_s.items()},
        "host_overlap": fit.host_overlap,
        "step_samples": samples,
        "methods": {
            "step_overhead_us": f"decode step of the embedding and LM head alone ({spec.model}, {spec.batch} "
                                f"requests, {dtype}, on {T} rank(s)), slowest rank's median of {spec.reps}, median "
                                f"over both contexts",
            "layer_overhead_us": f"host time per layer fitted to decode steps of {what}, beside Eq 10's device "
                                 f"time under this profile's theta (step_samples); rms residual {rms_us:.1f} us per "
                                 f"layer{caveats}",
            "host_overlap": f"least-squares fit (grid of 0.01) to the same steps as layer_overhead_us{caveats}",
        },
    }
