"""Tile shapes and launch settings of the Triton MLA kernels: data a backend chooses.

A backend builds one :class:`MLAKernelConfig` for the device it finds (by measurement, by
the device's limits) and hands it to :func:`splash_core.kernels.triton_mla_kernels`. The
kernels themselves never guess: everything that differs between devices is here.
"""

from __future__ import annotations

import dataclasses
import math


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def block(dim: int) -> int:
    """The power-of-two tile width (>= 16, as a matrix-multiply operand needs) covering ``dim``."""
    return max(16, 1 << math.ceil(math.log2(max(dim, 1))))


@dataclasses.dataclass(frozen=True)
class AttentionTile:
    """One program's share of the attention: ``rows`` query rows of one request times
    ``heads`` heads form the M side of both matrix multiplies; ``keys`` keys are read per
    loop iteration. ``warps`` and ``stages`` are Triton's ``num_warps`` and ``num_stages``."""

    rows: int = 1
    heads: int = 16
    keys: int = 32
    warps: int = 4
    stages: int = 2

    def __post_init__(self):
        for name in ("rows", "heads", "keys", "warps"):
            value = getattr(self, name)
            if not _power_of_two(value):
                raise ValueError(f"AttentionTile.{name} must be a power of two (got {value})")
        if self.rows * self.heads < 16:
            raise ValueError(f"AttentionTile rows x heads must be >= 16 for a matrix multiply "
                             f"(got {self.rows} x {self.heads})")
        if self.keys < 16:
            raise ValueError(f"AttentionTile.keys must be >= 16 for a matrix multiply (got {self.keys})")
        if self.stages < 1:
            raise ValueError(f"AttentionTile.stages must be >= 1 (got {self.stages})")

    @property
    def m(self) -> int:
        return self.rows * self.heads

    def shared_bytes(self, v_dim: int, rope_dim: int, elem_bytes: int) -> int:
        """Upper estimate of the shared memory one program needs: ``stages`` buffered key
        tiles, plus the query tile and the probability tile when the compiler stages them."""
        width = block(v_dim) + block(rope_dim)
        return elem_bytes * (self.stages * self.keys * width + self.m * width + self.m * self.keys)

    def label(self) -> str:
        return f"r{self.rows}h{self.heads}k{self.keys}w{self.warps}s{self.stages}"


@dataclasses.dataclass(frozen=True)
class MLAKernelConfig:
    """Everything the portable MLA kernels need to know about a device.

    - ``decode`` / ``extend``: tiles of the two attention entry points.
    - ``processors``: compute units of the device (streaming multiprocessors, compute units);
      decode splits each request's keys until about ``programs_per_processor`` programs per
      unit are in flight, with at most ``max_splits`` splits of at least
      ``min_keys_per_split`` keys.
    - ``copy_block``: elements one program moves in page pack/unpack and merge.
    - ``shared_memory_bytes``: the device's per-program limit, checked by :meth:`validate`
      (0 = unchecked).
    - ``launch_options``: extra (name, value) compiler options for the attention launch that
      only one Triton target understands (e.g. ``waves_per_eu``; other targets reject
      them, the interpreter ignores them), so such a config belongs to that target alone.
    """

    name: str
    decode: AttentionTile = AttentionTile()
    extend: AttentionTile = AttentionTile(rows=2, heads=16, keys=32)
    processors: int = 1
    programs_per_processor: int = 2
    max_splits: int = 64
    min_keys_per_split: int = 256
    copy_block: int = 2048
    shared_memory_bytes: int = 0
    launch_options: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        for name in ("processors", "programs_per_processor", "max_splits", "min_keys_per_split"):
            if getattr(self, name) < 1:
                raise ValueError(f"MLAKernelConfig.{name} must be >= 1 (got {getattr(self, name)})")
        if not _power_of_two(self.copy_block):
            raise ValueError(f"MLAKernelConfig.copy_block must be a power of two (got {self.copy_block})")

    def validate(self, v_dim: int, rope_dim: int, elem_bytes: int) -> "MLAKernelConfig":
        """Raise ValueError if a tile cannot fit the device's shared memory for these dims."""
        if self.shared_memory_bytes:
            for which in ("decode", "extend"):
                tile: AttentionTile = getattr(self, which)
                need = tile.shared_bytes(v_dim, rope_dim, elem_bytes)
                if need > self.shared_memory_bytes:
                    raise ValueError(
                        f"kernel config {self.name!r}: {which} tile {tile.label()} needs about {need} "
                        f"bytes of shared memory for d_c={v_dim}, d_r={rope_dim}; the device has "
                        f"{self.shared_memory_bytes}")
        return self

    def splits(self, rows: int, heads: int, max_keys: int) -> int:
        """How many key ranges decode splits each request into."""
        programs = rows * -(-heads // self.decode.heads)
        wanted = -(-self.processors * self.programs_per_processor // max(programs, 1))
        by_length = max(1, max_keys // self.min_keys_per_split)
        return max(1, min(wanted, by_length, self.max_splits))

    def with_processors(self, processors: int) -> "MLAKernelConfig":
        return dataclasses.replace(self, processors=max(1, int(processors)))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MLAKernelConfig":
        """Inverse of :meth:`to_dict`; unknown keys are an error naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown MLAKernelConfig keys {unknown} (known: {sorted(known)})")
        data = dict(data)
        for which in ("decode", "extend"):
            if isinstance(data.get(which), dict):
                data[which] = AttentionTile(**data[which])
        data["launch_options"] = tuple(tuple(pair) for pair in data.get("launch_options", ()))
        return cls(**data)


# Portable defaults: small tiles every Triton target compiles (no device-specific features).
PORTABLE = MLAKernelConfig(name="portable")
