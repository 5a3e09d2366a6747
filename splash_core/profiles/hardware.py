"""Hardware profiles: θ of the cost model, each number with its provenance (docs/design.md §5)."""

from __future__ import annotations

import dataclasses
import types
from typing import Mapping

from ..layouts import LAYOUTS, Layout
from .quantity import Quantity
from .schema import Problem, ProfileError, field, non_negative, one_of, positive

GIB = 1 << 30
STEP_PATHS = ("eager", "replay", "static")


@dataclasses.dataclass(frozen=True)
class CollectiveSample:
    """One calibrated collective: op over ``bytes`` per rank took ``seconds`` (measured)."""

    op: str = field("all_gather | all_to_all | all_reduce", checks=[one_of("all_gather", "all_to_all", "all_reduce")])
    ranks: int = field("group size it ran on", checks=[positive])
    bytes: int = field("bytes each rank receives (all_gather/all_to_all) or reduces", checks=[positive])
    seconds: float = field("median time", checks=[positive])


@dataclasses.dataclass(frozen=True)
class StepSample:
    """One timed runtime step behind the fitted host overheads (measured profiles only):
    ``layers`` layers computing in ``layout`` (0 layers: embedding and LM head alone, which
    gives t0), ``batch`` requests of ``context`` tokens, the slowest rank's median."""

    layout: Layout = field("layout the layers computed in")
    layers: int = field("layers of the timed model", checks=[non_negative])
    batch: int = field("requests", checks=[positive])
    context: int = field("history tokens per request, this step's rows included", checks=[positive])
    seconds: float = field("median step time", checks=[positive])
    phase: str = field("decode (one query row per request) or prefill (a chunk of rows per request)",
                       default="decode", checks=[one_of("decode", "prefill")])
    rows: int = field("query rows per request (1 in decode)", default=1, checks=[positive])
    path: str = field("how the step ran: eager, replay (of its captured graph) or static (the graph path's "
                      "buffers run eagerly: the backend captures nothing)", default="eager",
                      checks=[one_of(*STEP_PATHS)])


def _no_overheads():
    return types.MappingProxyType({})


def parse_direction(text: str) -> tuple[Layout, Layout]:
    """'DOP->CP' -> (DOP, CP); ValueError names what is wrong."""
    src, sep, dst = str(text).partition("->")
    if not sep:
        raise ValueError(f"expected SRC->DST, e.g. DOP->CP (got {text!r})")
    a, b = Layout.parse(src.strip()), Layout.parse(dst.strip())
    if a is b:
        raise ValueError(f"a switch needs two different layouts (got {text!r})")
    return a, b


@dataclasses.dataclass(frozen=True)
class TransferReference:
    """The transfer law of Eq 13-14: per-layer network time of each directed switch, measured
    once at ``batch`` requests of ``context`` tokens; a switch of another batch scales it by the
    bytes it moves (linear in B·s for KV, fixed for weights). Directions left out move nothing
    over the network there (a discard) or fall back to bytes / bandwidth."""

    batch: int = field("B_ref: requests of the reference switch", checks=[positive])
    context: int = field("s_ref: context tokens per request of the reference switch", checks=[positive])
    weights_ms: dict[str, Quantity] = field("per-layer weight transfer time per direction SRC->DST, ms",
                                            default_factory=_no_overheads)
    kv_ms: dict[str, Quantity] = field("per-layer KV (+ indexer, recurrent) transfer time per direction "
                                       "SRC->DST at the reference batch, ms", default_factory=_no_overheads)

    def problems(self):
        for key in ("weights_ms", "kv_ms"):
            for direction in getattr(self, key):
                try:
                    parse_direction(direction)
                except ValueError as exc:
                    yield Problem(f"{key}.{direction}", str(exc))

    def per_layer_s(self, state_class: str, src: Layout, dst: Layout) -> float | None:
        """Reference seconds per layer of ``weights`` or ``kv`` from ``src`` to ``dst`` (None: none given)."""
        table = self.weights_ms if state_class == "weights" else self.kv_ms
        for direction, q in table.items():
            if parse_direction(direction) == (src, dst):
                return q.value * 1e-3
        return None


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
    attention_tflops: Quantity | None = field(
        "rate attention kernels reach on prefill rows (query-key products), TFLOP/s; absent = matmul_tflops",
        default=None)
    decode_attention_tflops: Quantity | None = field(
        "rate attention kernels reach on decode rows (one query row per request, every head of a rank "
        "against one latent), TFLOP/s; absent = attention_tflops", default=None)
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
    graph_step_overhead_us: Quantity | None = field(
        "t0 of a decode step replayed from captured graphs (inputs refreshed, replay, logits), µs; "
        "only with graph_layer_overhead_us", default=None)
    graph_layer_overhead_us: dict[Layout, Quantity] = field(
        "time per layer a decode step replayed from captured graphs takes beyond Eq 10's stages (the gaps "
        "between its kernels: it adds to the device time), µs; pure decode steps of a runtime that replays "
        "graphs are charged it and graph_step_overhead_us instead of layer_overhead_us and t0 (every "
        "layout, or none: absent = decode steps are charged as every other step)",
        default_factory=_no_overheads,
    )
    graph_capture_ms_per_layer: Quantity | None = field(
        "host time of capturing one decode graph (one layout, one bucket: warm-up runs included, as the "
        "runtime records it), ms per layer of the step; a switch that moves weights is charged one capture "
        "(Eq 7, splash_core.planning.graph_costs). Absent: the backend captures no graphs, nothing is charged",
        default=None)
    graph_pool_mib: Quantity | None = field(
        "device memory of a rank's captured decode graphs, MiB: they share one pool, sized by the largest "
        "step's buffers, not by layers or buckets; Eq 6's scratch term A counts it in every layout (absent: "
        "0). Only with graph_capture_ms_per_layer",
        default=None)
    collective_samples: tuple[CollectiveSample, ...] = field(
        "calibrated collective times across message sizes (measured profiles only)", default=()
    )
    switch_transfer: TransferReference | None = field(
        "Eq 13-14's per-direction references for switch transfer times (absent: bytes / bandwidth + latency)",
        default=None,
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
        graph = set(self.graph_layer_overhead_us)
        if graph and graph != set(LAYOUTS):
            missing = ", ".join(str(l) for l in LAYOUTS if l not in graph)
            yield Problem("graph_layer_overhead_us", f"give every layout or none (missing {missing})")
        if (self.graph_step_overhead_us is None) != (not graph):
            yield Problem("graph_step_overhead_us", "give it together with graph_layer_overhead_us (a replayed "
                                                    "step's t0 and its time per layer are fitted together)")
        if self.graph_pool_mib is not None and self.graph_capture_ms_per_layer is None:
            yield Problem("graph_pool_mib", "only with graph_capture_ms_per_layer (a backend that holds "
                                                 "graphs captures them)")
        if self.host_overlap is not None:
            if not given:
                yield Problem("host_overlap", "only meaningful with layer_overhead_us")
            elif self.host_overlap.value > 1:
                yield Problem("host_overlap.value", "must be in [0, 1]", self.host_overlap.value)

    @property
    def attention_flops(self) -> float:
        """FLOP/s of attention kernels (matmul_tflops when not given)."""
        return (self.attention_tflops or self.matmul_tflops).value * 1e12

    @property
    def decode_attention_flops(self) -> float:
        """FLOP/s of attention kernels on decode rows (attention_flops when not given)."""
        return self.decode_attention_tflops.value * 1e12 if self.decode_attention_tflops else self.attention_flops

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib.value * GIB

    def layer_overhead_s(self, layout: Layout) -> float:
        """h of ``layout`` in seconds (0 without calibrated overheads)."""
        q = self.layer_overhead_us.get(layout)
        return 0.0 if q is None else q.value * 1e-6

    @property
    def replays_graphs(self) -> bool:
        """Whether this θ holds the time of decode steps replayed from captured graphs."""
        return bool(self.graph_layer_overhead_us)

    @property
    def captures_graphs(self) -> bool:
        """Whether this θ says the backend captures decode graphs (it holds their capture time)."""
        return self.graph_capture_ms_per_layer is not None

    def graph_layer_overhead_s(self, layout: Layout) -> float:
        """Replayed decode steps' time per layer beyond Eq 10 of ``layout``, seconds (0 without)."""
        q = self.graph_layer_overhead_us.get(layout)
        return 0.0 if q is None else q.value * 1e-6

    @property
    def host_overlap_fraction(self) -> float:
        """η_h (0 when absent)."""
        return 0.0 if self.host_overlap is None else self.host_overlap.value

    def without_host_overheads(self) -> "HardwareProfile":
        """This θ with Eq 10's device stages alone (what a fit of the overheads compares against)."""
        return dataclasses.replace(self, layer_overhead_us=_no_overheads(), host_overlap=None, step_samples=(),
                                   graph_layer_overhead_us=_no_overheads(), graph_step_overhead_us=None)

    def with_host_overheads(self, layer_overhead_us: Mapping[Layout | str, float], host_overlap: float,
                            graph_layer_overhead_us: Mapping[Layout | str, float] | None = None,
                            graph_step_overhead_us: float | None = None, **provenance: str) -> "HardwareProfile":
        """This θ with another host term (µs per layer by layout, η_h; and, where given, the
        replayed decode steps' µs per layer and t0, else this θ's), every number carrying
        ``provenance`` (source, ref, date, machine, command), validated as a loaded profile is."""
        where = f"<{self.name} with host overheads>"

        def quantity(path: str, value: float) -> Quantity:
            return Quantity.from_yaml_value({"value": float(value), **provenance}, file=where, path=path)

        def per_layout(key: str, values: Mapping[Layout | str, float]):
            out = {}
            for layout, value in values.items():
                try:
                    parsed = Layout.parse(layout)
                except ValueError as exc:
                    raise ProfileError(where, f"{key}.{layout}", str(exc)) from None
                out[parsed] = quantity(f"{key}.{parsed}", value)
            return types.MappingProxyType(out)

        graph = {}
        if graph_layer_overhead_us is not None:
            graph["graph_layer_overhead_us"] = per_layout("graph_layer_overhead_us", graph_layer_overhead_us)
        if graph_step_overhead_us is not None:
            graph["graph_step_overhead_us"] = quantity("graph_step_overhead_us", graph_step_overhead_us)
        profile = dataclasses.replace(self, layer_overhead_us=per_layout("layer_overhead_us", layer_overhead_us),
                                      host_overlap=quantity("host_overlap", host_overlap), step_samples=(), **graph)
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
            elif f.name in ("layer_overhead_us", "graph_layer_overhead_us"):
                out.update({f"{f.name}.{layout}": value[layout] for layout in LAYOUTS if layout in value})
            elif isinstance(value, TransferReference):
                for key in ("weights_ms", "kv_ms"):
                    out.update({f"{f.name}.{key}.{d}": q for d, q in getattr(value, key).items()})
        return out
