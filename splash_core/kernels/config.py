"""Tile shapes and launch settings of the Triton MLA kernels: data a backend chooses.

A backend builds one :class:`MLAKernelConfig` for the device it finds (by measurement, by
the device's limits) and hands it to :func:`splash_core.kernels.triton_mla_kernels`. The
kernels themselves never guess: everything that differs between devices is here, including
which tile serves which head count (a small table: :class:`TileRule`).
"""

from __future__ import annotations

import dataclasses
import math

ENTRIES = ("decode", "extend")
# Fixed cost of one program in units of one key tile's loop iteration (query load, block-table
# scan, epilogue) and of the merge pass (its launch and the read of the first partials).
_PROGRAM_SETUP_TILES = 2.0
_MERGE_SETUP_TILES = 2.0
_SPLIT_TOLERANCE = 0.02


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def decode_shaped(rows: int, table_rows: int) -> bool:
    """Whether a call of ``rows`` query rows over a block table of ``table_rows`` requests is a decode
    step's (at most a row per request), which kernels and providers tile or choose apart from prefill."""
    return rows <= table_rows


def block(dim: int) -> int:
    """The power-of-two tile width (>= 16, as a matrix-multiply operand needs) covering ``dim``."""
    return max(16, 1 << math.ceil(math.log2(max(dim, 1))))


@dataclasses.dataclass(frozen=True)
class AttentionTile:
    """One program's share of the attention.

    - ``rows`` query rows of one request times ``heads`` heads form the M side of both
      matrix multiplies (every head of a row reads the same latent keys, so a key tile
      loaded once serves them all); ``keys`` keys are read per loop iteration.
    - ``value_split`` (1 or 2): programs that share the (rows, heads) block and each
      accumulate ``1/value_split`` of the value columns. Each recomputes the scores, so it
      trades matrix-multiply work for fewer accumulator registers (large M).
    - ``warps`` and ``stages`` are Triton's ``num_warps`` and ``num_stages``; with a key tile
      inside one page the key loads run ``stages - 1`` iterations ahead of their use.
    - ``resident``: programs of this tile one processor runs at once (from its shared memory
      and registers); decode sizes its key splits to fill ``processors x resident`` slots.
    """

    rows: int = 1
    heads: int = 16
    keys: int = 32
    warps: int = 4
    stages: int = 2
    value_split: int = 1
    resident: int = 2

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
        if self.value_split not in (1, 2):
            raise ValueError(f"AttentionTile.value_split must be 1 or 2 (got {self.value_split})")
        if self.resident < 1:
            raise ValueError(f"AttentionTile.resident must be >= 1 (got {self.resident})")

    @property
    def m(self) -> int:
        return self.rows * self.heads

    def shared_bytes(self, v_dim: int, rope_dim: int, elem_bytes: int) -> int:
        """Estimate (from above, within a few KiB of Triton 3.6's sm_90 builds) of the shared
        memory one program needs: the key tiles, the query tile, the probability tile when
        the compiler stages it there, and reduction scratch. Key tiles: ``stages - 1`` in
        flight, or ``stages`` from 64 rows on, where targets with asynchronous matrix
        multiplies keep the tile being multiplied alive while the next ones load; without
        pipelining (one stage) the loaded tile and its transposed operand copy."""
        width = block(v_dim) + block(rope_dim)
        if self.stages == 1:
            buffers = 2
        else:
            buffers = self.stages if self.m >= 64 else self.stages - 1
        return elem_bytes * (buffers * self.keys * width + self.m * width + self.m * self.keys) + 1024

    def label(self) -> str:
        split = f"v{self.value_split}" if self.value_split > 1 else ""
        return f"r{self.rows}h{self.heads}k{self.keys}w{self.warps}s{self.stages}{split}p{self.resident}"


@dataclasses.dataclass(frozen=True)
class TileRule:
    """Use ``tile`` for ``entry`` ("decode" or "extend") when a call has at least
    ``min_heads`` heads (DP/DOP owners compute all heads: compute-bound, wider tiles win;
    TP ranks a few: bound by key reads)."""

    entry: str
    min_heads: int
    tile: AttentionTile

    def __post_init__(self):
        if self.entry not in ENTRIES:
            raise ValueError(f"TileRule.entry must be one of {ENTRIES} (got {self.entry!r})")
        if self.min_heads < 1:
            raise ValueError(f"TileRule.min_heads must be >= 1 (got {self.min_heads})")


@dataclasses.dataclass(frozen=True)
class MLAKernelConfig:
    """Everything the portable MLA kernels need to know about a device.

    - ``decode`` / ``extend``: tiles of the two attention entry points; ``rules`` override
      them by head count (:meth:`tile`).
    - ``processors``: compute units of the device (streaming multiprocessors, compute units).
      Decode and short extends split each request's keys into at most ``max_splits`` ranges
      of at least ``min_keys_per_split`` keys, as many as a small cost model of waves,
      per-program setup and merge traffic finds fastest (:meth:`splits`).
    - ``copy_block``: elements one program moves in page pack/unpack.
    - ``shared_memory_bytes``: the device's per-program limit, checked by :meth:`validate`
      (0 = unchecked).
    - ``launch_options``: extra (name, value) compiler options for the attention launch that
      only one Triton target understands (e.g. ``waves_per_eu``; other targets reject
      them, the interpreter ignores them), so such a config belongs to that target alone.
    """

    name: str
    decode: AttentionTile = AttentionTile()
    extend: AttentionTile = AttentionTile(rows=2, heads=16, keys=32)
    rules: tuple[TileRule, ...] = ()
    processors: int = 1
    max_splits: int = 64
    min_keys_per_split: int = 256
    copy_block: int = 2048
    shared_memory_bytes: int = 0
    launch_options: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        for name in ("processors", "max_splits", "min_keys_per_split"):
            if getattr(self, name) < 1:
                raise ValueError(f"MLAKernelConfig.{name} must be >= 1 (got {getattr(self, name)})")
        if not _power_of_two(self.copy_block):
            raise ValueError(f"MLAKernelConfig.copy_block must be a power of two (got {self.copy_block})")
        seen = set()
        for rule in self.rules:
            if (rule.entry, rule.min_heads) in seen:
                raise ValueError(f"MLAKernelConfig.rules: two rules for {rule.entry} at min_heads {rule.min_heads}")
            seen.add((rule.entry, rule.min_heads))

    def tile(self, entry: str, heads: int) -> AttentionTile:
        """The tile of ``entry`` for calls with ``heads`` heads: the rule with the largest
        ``min_heads <= heads``, else the entry's own tile."""
        best, chosen = 0, getattr(self, entry)
        for rule in self.rules:
            if rule.entry == entry and best < rule.min_heads <= heads:
                best, chosen = rule.min_heads, rule.tile
        return chosen

    def tiles(self) -> list[tuple[str, AttentionTile]]:
        """Every (what, tile) this config can launch, for checks and reports."""
        return [("decode", self.decode), ("extend", self.extend)] + [
            (f"{r.entry} (heads >= {r.min_heads})", r.tile) for r in self.rules]

    def validate(self, v_dim: int, rope_dim: int, elem_bytes: int) -> "MLAKernelConfig":
        """Raise ValueError if a tile cannot fit the device's shared memory for these dims."""
        if self.shared_memory_bytes:
            for which, tile in self.tiles():
                need = tile.shared_bytes(v_dim, rope_dim, elem_bytes)
                if need > self.shared_memory_bytes:
                    raise ValueError(
                        f"kernel config {self.name!r}: {which} tile {tile.label()} needs about {need} "
                        f"bytes of shared memory for d_c={v_dim}, d_r={rope_dim}; the device has "
                        f"{self.shared_memory_bytes}")
        return self

    def splits(self, tile: AttentionTile, programs: int, max_keys: int, partial_tiles: float) -> int:
        """How many key ranges to split each request into.

        ``programs``: programs without splitting (row blocks x head blocks x value parts);
        ``max_keys``: keys of the longest request; ``partial_tiles``: bytes one split program
        writes and the merge reads back, in units of one key tile. Programs of equal length
        run in waves of ``processors x tile.resident``; the estimate is waves x (key tiles
        per split + setup) plus the merge's traffic spread over the device. The fewest
        splits within ``_SPLIT_TOLERANCE`` of the best estimate win: the model is rough, and
        every split adds partials to write and merge. Pure arithmetic: callers cache it.
        """
        slots = self.processors * tile.resident
        most = max(1, min(self.max_splits, max_keys // self.min_keys_per_split))
        costs = []
        for splits in range(1, most + 1):
            waves = -(-programs * splits // slots)
            per_split = -(-max_keys // (splits * tile.keys))
            cost = waves * (per_split + _PROGRAM_SETUP_TILES)
            if splits > 1:
                cost += _MERGE_SETUP_TILES + programs * splits * partial_tiles / slots
            costs.append(cost)
        good_enough = min(costs) * (1 + _SPLIT_TOLERANCE)
        return next(splits for splits, cost in enumerate(costs, start=1) if cost <= good_enough)

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
        for which in ENTRIES:
            if isinstance(data.get(which), dict):
                data[which] = AttentionTile(**data[which])
        data["rules"] = tuple(
            TileRule(**{**rule, "tile": AttentionTile(**rule["tile"])}) if isinstance(rule, dict) else rule
            for rule in data.get("rules", ()))
        data["launch_options"] = tuple(tuple(pair) for pair in data.get("launch_options", ()))
        return cls(**data)


# Portable defaults: small tiles every Triton target compiles (no device-specific features).
PORTABLE = MLAKernelConfig(name="portable")


@dataclasses.dataclass(frozen=True)
class ExpandedTile:
    """One program's share of expanded (MHA-form) attention (:mod:`.expanded`): ``block_m``
    query rows of one request and ONE head against ``block_n`` keys per loop iteration, so the
    scores are a [block_m, d_n + d_r] x [d_n + d_r, block_n] product. ``warps`` and ``stages``
    are Triton's ``num_warps`` and ``num_stages``.

    The defaults suit a large current GPU (about 228 KiB of shared memory per processor) at
    DeepSeek-V3 widths (128 heads, d_n 128 + d_r 64, d_v 128): about 170 KiB of shared memory
    with three stages. Wider heads (GLM-5's d_v 256)
    need fewer stages or narrower tiles; a backend picks them."""

    block_m: int = 128
    block_n: int = 64
    warps: int = 8
    stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if not _power_of_two(value) or value < 16:
                raise ValueError(f"ExpandedTile.{name} must be a power of two >= 16 (got {value})")
        if not _power_of_two(self.warps):
            raise ValueError(f"ExpandedTile.warps must be a power of two (got {self.warps})")
        if self.stages < 1:
            raise ValueError(f"ExpandedTile.stages must be >= 1 (got {self.stages})")

    def fitted(self, rows: int, keys: int) -> "ExpandedTile":
        """The tile for a call of ``rows`` query rows and ``keys`` keys in all: no wider than the
        problem (a one-row call computes 16 rows, not 128), with the warps the smaller tile can
        use (one warp per 256 score elements, at most ``warps``)."""
        block_m = min(self.block_m, block(rows))
        block_n = min(self.block_n, block(keys))
        warps = min(self.warps, max(1, block_m * block_n // 256))
        return dataclasses.replace(self, block_m=block_m, block_n=block_n, warps=1 << (warps.bit_length() - 1))

    def label(self) -> str:
        return f"m{self.block_m}n{self.block_n}w{self.warps}s{self.stages}"
