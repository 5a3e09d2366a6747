"""Hardware profiles: θ of the cost model, each number with its provenance (docs/design.md §5)."""

from __future__ import annotations

import dataclasses
import types
from typing import Mapping

from ..layouts import LAYOUTS, Layout
from .quantity import Quantity
from .schema import Problem, ProfileError, field, non_negative, one_of, positive

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class CollectiveSample:
    """One calibrated collective: op over ``bytes`` per rank took ``seconds`` (measured)."""

    op: str = field("all_gather | all_to_all | all_reduce", checks=[one_of("all_gather", "all_to_all", "all_reduce")])
    ranks: int = field("group size it ran on", checks=[positive])
    bytes: int = field("bytes each rank receives (all_gather/all_to_all) or reduces", checks=[positive])
    seconds: float = field("median time", checks=[positive])


@dataclasses.dataclass(frozen=True)
class StepSample:
    """One timed runtime decode step behind the fitted host overheads (measured profiles only):
    ``layers`` layers computing in ``layout`` (0 layers: embedding and LM head alone, which
    gives t0), ``batch`` requests of ``context`` tokens, the slowest rank's median."""

    layout: Layout = field("layout the layers computed in")
    layers: int = field("layers of the timed model", checks=[non_negative])
    batch: int = field("requests, one query row each", checks=[positive])
    context: int = field("history tokens per request, this step's row included", checks=[positive])
    seconds: float = field("median step time", checks=[positive])


def _no_overheads():
    return types.MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """θ: device memory, compute and memory rates, interconnect bandwidths and latency.

    Bandwidths are what one rank achieves: bytes it receives per second for all-gather and
    all-to-all, bytes it reduces per second for all-reduce.

    ``layer_overhead_us`` and ``host_overlap`` are what a runtime adds to Eq 10's device
    stages (its host work per layer: kernel launches, Python, synchronisation); calibration
    measures them on this machine's runtime (``splash calibrate``). Paper and datasheet
    profiles leave them out, and the cost model is then Eq 10 as printed.
    """

    profile_kind = "hardware"

    name: str = field("profile name")
    platform: str = field("short platform id used for results folders (b200, h200, dcu, cpu)")
    device: str = field("what the device is, in words")
    memory_gib: Quantity = field("device memory per rank, GiB")
    matmul_tflops: Quantity = field("dense matrix-multiply rate in the compute dtype, TFLOP/s")
    weight_read_gbps: Quantity = field("bandwidth reading resident weights, GB/s")
    kv_read_gbps: Quantity = field("bandwidth reading the paged KV cache in attention, GB/s")
    all_gather_gbps: Quantity = field("all-gather bandwidth per rank (received bytes), GB/s")
    all_to_all_gbps: Quantity = field("all-to-all bandwidth per rank (received bytes), GB/s")
    all_reduce_gbps: Quantity = field("all-reduce bandwidth per rank (reduced bytes), GB/s")
    collective_latency_us: Quantity = field("fixed latency of one collective, µs")
    step_overhead_us: Quantity = field("t0 of Eq 10: fixed per-step overhead, µs")
    layer_overhead_us: dict[Layout, Quantity] = field(
        "host time h per layer of each layout that Eq 10's stages leave out, µs; with it a layer costs "
        "its Eq 10 time plus [h − host_overlap × that time]+ (every layout, or none: absent = Eq 10 as printed)",
        default_factory=_no_overheads,
    )
    host_overlap: Quantity | None = field(
        "η_h in [0, 1]: fraction of a layer's Eq 10 time the host overhead hides behind (0: the two add, "
        "1: the layer takes the longer of the two); absent = 0. Only with layer_overhead_us",
        default=None,
    )
    collective_samples: tuple[CollectiveSample, ...] = field(
        "calibrated collective times across message sizes (measured profiles only)", default=()
    )
    step_samples: tuple[StepSample, ...] = field(
        "timed runtime steps the host overheads were fitted to (measured profiles only)", default=()
    )
    notes: str = field("caveats", default="")

    def problems(self):
        if self.memory_gib.value <= 0:
            yield Problem("memory_gib.value", "must be > 0: nothing would fit on the device", self.memory_gib.value)
        given = set(self.layer_overhead_us)
        if given and given != set(LAYOUTS):
            missing = ", ".join(str(l) for l in LAYOUTS if l not in given)
            yield Problem("layer_overhead_us", f"give every layout or none (missing {missing}): a layout "
                                               "without its overhead would look cheaper than it runs")
        if self.host_overlap is not None:
            if not given:
                yield Problem("host_overlap", "only meaningful with layer_overhead_us")
            elif self.host_overlap.value > 1:
                yield Problem("host_overlap.value", "must be in [0, 1]", self.host_overlap.value)

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib.value * GIB

    def layer_overhead_s(self, layout: Layout) -> float:
        """h of ``layout`` in seconds (0 without calibrated overheads)."""
        q = self.layer_overhead_us.get(layout)
        return 0.0 if q is None else q.value * 1e-6

    @property
    def host_overlap_fraction(self) -> float:
        """η_h (0 when absent)."""
        return 0.0 if self.host_overlap is None else self.host_overlap.value

    def without_host_overheads(self) -> "HardwareProfile":
        """This θ with Eq 10's device stages alone (what a fit of the overheads compares against)."""
        return dataclasses.replace(self, layer_overhead_us=_no_overheads(), host_overlap=None, step_samples=())

    def with_host_overheads(self, layer_overhead_us: Mapping[Layout | str, float], host_overlap: float,
                            **provenance: str) -> "HardwareProfile":
        """This θ with another host term (µs per layer by layout, η_h), every number carrying
        ``provenance`` (source, ref, date, machine, command), validated as a loaded profile is."""
        where = f"<{self.name} with host overheads>"

        def quantity(path: str, value: float) -> Quantity:
            return Quantity.from_yaml_value({"value": float(value), **provenance}, file=where, path=path)

        overheads = {}
        for layout, value in layer_overhead_us.items():
            try:
                key = Layout.parse(layout)
            except ValueError as exc:
                raise ProfileError(where, f"layer_overhead_us.{layout}", str(exc)) from None
            overheads[key] = quantity(f"layer_overhead_us.{key}", value)
        profile = dataclasses.replace(self, layer_overhead_us=types.MappingProxyType(overheads),
                                      host_overlap=quantity("host_overlap", host_overlap), step_samples=())
        for problem in profile.problems():
            raise ProfileError(where, problem.path, problem.reason, problem.got)
        return profile

    def quantities(self) -> dict[str, Quantity]:
        """Every provenance-tagged number by key (for reports and the CLI); per-layout
        overheads as ``layer_overhead_us.TP`` and so on."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Quantity):
                out[f.name] = value
            elif f.name == "layer_overhead_us":
                out.update({f"{f.name}.{layout}": value[layout] for layout in LAYOUTS if layout in value})
        return out
