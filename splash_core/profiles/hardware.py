"""Hardware profiles: θ of the cost model, each number with its provenance (DESIGN.md §5)."""

from __future__ import annotations

import dataclasses

from .quantity import Quantity
from .schema import field, one_of, positive

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class CollectiveSample:
    """One calibrated collective: op over ``bytes`` per rank took ``seconds`` (measured)."""

    op: str = field("all_gather | all_to_all | all_reduce", checks=[one_of("all_gather", "all_to_all", "all_reduce")])
    ranks: int = field("group size it ran on", checks=[positive])
    bytes: int = field("bytes each rank receives (all_gather/all_to_all) or reduces", checks=[positive])
    seconds: float = field("median time", checks=[positive])


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """θ: device memory, compute and memory rates, interconnect bandwidths and latency.

    Bandwidths are what one rank achieves: bytes it receives per second for all-gather and
    all-to-all, bytes it reduces per second for all-reduce.
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
    collective_samples: tuple[CollectiveSample, ...] = field(
        "calibrated collective times across message sizes (measured profiles only)", default=()
    )
    notes: str = field("caveats", default="")

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib.value * GIB

    def quantities(self) -> dict[str, Quantity]:
        """Every provenance-tagged number by key (for reports and the CLI)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), Quantity)
        }

