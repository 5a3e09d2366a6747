"""Tile sweep of bench/gpu_kernels.py: candidate tiles timed on the workloads the Hopper
config's tile table serves, the winners assembled into that table.

Workloads (heads per rank; DeepSeek-V3 dims, bf16, pages of 64):

- ``decode-h16``: 16 heads (128 over 8 ranks: TP, DOP projections), bound by key reads;
  batch 16 and 64 at 32K and 128K tokens of context. Its winner is the decode tile.
- ``decode-h128``: 128 heads (a DP/DOP owner), bound by compute; batch 16 at 32K. Its winner
  serves decode from 64 heads on (a rule), when it differs from the decode tile.
- ``extend-h128``: a 2048-row prefill chunk at 8K context, 128 heads. The best candidate of
  16 heads per program is the extend tile (it serves any head count); a wider winner serves
  extend from 64 heads on.

Every candidate first runs the bf16 correctness cases at its workload's head count (long
requests, so decode splits and the merge runs); a wrong or failing candidate is recorded
and skipped. Candidates are listed most promising first (from sm_90 builds: no register
spills, key loads ahead of their use) and a workload stops taking new candidates once its
time budget is spent.

Ranking: per point the fastest correct time; a candidate's score is its mean time relative
to those (1.0 = fastest everywhere).
"""

from __future__ import annotations

import dataclasses
import time

import gpu_timing as gt
import torch

from splash_core.kernels import AttentionTile, MLAKernelConfig, TileRule, triton_mla_kernels


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    entry: str  # "decode" or "extend"
    heads: int
    points: tuple  # decode: (batch, context); extend: (rows, context)
    budget_s: float
    candidates: tuple[AttentionTile, ...]


def _t(rows, heads, keys, warps, stages, resident, value_split=1) -> AttentionTile:
    return AttentionTile(rows=rows, heads=heads, keys=keys, warps=warps, stages=stages, value_split=value_split,
                         resident=resident)


# The tiles tuned before this sweep (measured 2026-11-29): decode r1h16k64w8s2, extend r4h16k64w8s2.
PREVIOUS = {"decode": _t(1, 16, 64, 8, 2, 2), "extend": _t(4, 16, 64, 8, 2, 1)}

# ``resident`` from Triton 3.6 sm_90 builds (registers, shared memory); the sweep replaces it
# with the count from the kernel compiled on the device when it can read that.
WORKLOADS = (
    Workload("decode-h16", "decode", 16, ((16, 32768), (64, 32768), (16, 131072), (64, 131072)), 40.0, (
        _t(1, 16, 32, 4, 3, 2),   # 2 programs/SM, each with 1 key tile (36 KB) in flight while it computes
        _t(1, 16, 32, 8, 3, 2),   # the same with 8 warps (97 registers)
        _t(1, 16, 16, 4, 4, 3),   # 3 programs/SM x 2 tiles of 16 keys ahead
        _t(1, 16, 32, 4, 4, 1),   # 1 program/SM, 2 tiles of 32 keys ahead
        _t(1, 16, 16, 4, 5, 2),
        _t(1, 16, 64, 8, 3, 1),   # 1 program/SM, 1 tile of 64 keys ahead
        _t(1, 16, 32, 4, 5, 1),   # 3 tiles of 32 keys ahead
        _t(1, 16, 16, 4, 6, 2),
        PREVIOUS["decode"],       # the previous tile: one buffer, no load ahead
    )),
    Workload("decode-h128", "decode", 128, ((16, 32768),), 25.0, (
        _t(1, 64, 32, 8, 3, 1),   # 64 heads: tensor-core sized M, keys read twice (not 8 times)
        _t(1, 64, 16, 8, 4, 1),
        _t(1, 64, 32, 8, 4, 1),
        _t(1, 64, 32, 8, 3, 1, value_split=2),  # fewer registers, scores computed twice
        _t(1, 64, 16, 4, 4, 1, value_split=2),
        _t(1, 32, 32, 8, 3, 1),
        _t(1, 16, 32, 4, 3, 2),
        PREVIOUS["decode"],
        _t(1, 128, 32, 8, 2, 1, value_split=2),  # M = 128, keys read once; no load ahead (smem)
        _t(1, 64, 64, 8, 2, 1),   # 64 keys a step; spills in sm_90 builds
    )),
    Workload("extend-h128", "extend", 128, ((2048, 8192),), 35.0, (
        _t(4, 16, 32, 8, 3, 1),
        _t(1, 64, 32, 8, 3, 1),
        _t(4, 16, 32, 8, 4, 1),
        _t(2, 32, 32, 8, 3, 1),
        _t(4, 16, 16, 8, 4, 1),
        _t(4, 16, 32, 4, 3, 1, value_split=2),
        _t(2, 64, 32, 8, 2, 1, value_split=2),  # M = 128
        PREVIOUS["extend"],       # 255 registers and spills in the current kernel
    )),
)


def _time_points(kernels, pool, workload: Workload) -> list[dict]:
    if workload.entry == "decode":
        return [gt.decode_point(kernels, pool, b, c, workload.heads) for b, c in workload.points]
    return [gt.prefill_point(kernels, pool, r, c, workload.heads) for r, c in workload.points]


def _rate(point: dict) -> dict:
    keep = ("kv_gbps", "tflops")
    return {k: round(point[k], 1) for k in keep if k in point}


class Sweep:
    """Runs the workloads with ``base`` (the current Hopper config) as the starting point;
    ``check(kernels, entry, heads) -> (ok, detail)`` is the correctness gate."""

    def __init__(self, device, base: MLAKernelConfig, check, quick: bool = False):
        self.device, self.base, self.check, self.quick = device, base, check, quick
        self.samples: list[dict] = []

    def run(self) -> tuple[MLAKernelConfig, dict]:
        pool = gt.PagedPool(self.device, 64, 131072)
        winners = {}
        for workload in WORKLOADS:
            winners[workload.name] = self._workload(pool, workload)
        del pool
        torch.cuda.empty_cache()
        return self._assemble(winners), self._summary(winners)

    def _workload(self, pool, workload: Workload) -> list[dict]:
        started = time.monotonic()
        rows = []
        candidates = workload.candidates[:3] if self.quick else workload.candidates
        for tile in candidates:
            if time.monotonic() - started > workload.budget_s:
                rows.append({"workload": workload.name, "kernel": "current", "tile": tile.label(),
                             "skipped": f"time budget of {workload.budget_s:.0f} s spent"})
                continue
            rows.append(self._candidate(pool, workload, tile))
        self._rank(rows, workload)
        self.samples += rows
        return rows

    def _candidate(self, pool, workload: Workload, tile: AttentionTile) -> dict:
        row = {"workload": workload.name, "kernel": "current", "tile": tile.label()}
        t0 = time.monotonic()
        try:
            config = dataclasses.replace(self.base, name="sweep", rules=(), **{workload.entry: tile})
            config.validate(gt.D_C, gt.D_R, 2)
            ok, detail = self.check(triton_mla_kernels(config), workload.entry, workload.heads)
            row.update(correct=ok, check=detail)
            if not ok:
                return row
            built = gt.attention_occupancy(self.device, tile)
            if built:
                row.update(built=built)
                if built["occupancy"] >= 1 and built["occupancy"] != tile.resident:
                    tile = dataclasses.replace(tile, resident=built["occupancy"])
                    config = dataclasses.replace(config, **{workload.entry: tile})
                    row["tile_used"] = tile.label()
            kernels = triton_mla_kernels(config)
            points = _time_points(kernels, pool, workload)
            row.update(ms=[p["ms"] for p in points], rates=[_rate(p) for p in points],
                       splits=[kernels_plan(kernels, workload, p) for p in workload.points])
            row["_tile"] = tile
        except Exception as exc:  # a tile that does not compile or fit is a result too
            row["error"] = _one_line(exc)
        finally:
            row["seconds"] = round(time.monotonic() - t0, 1)
            _report(row)
        return row

    @staticmethod
    def _rank(rows: list[dict], workload: Workload) -> None:
        timed = [r for r in rows if r.get("correct") and "ms" in r]
        if not timed:
            return
        fastest = [min(r["ms"][i] for r in timed) for i in range(len(workload.points))]
        for r in timed:
            r["relative"] = round(sum(t / f for t, f in zip(r["ms"], fastest)) / len(fastest), 4)

    def _assemble(self, winners: dict) -> MLAKernelConfig:
        def best(name, heads_at_most=None):
            rows = [r for r in winners[name] if "_tile" in r and "relative" in r
                    and (heads_at_most is None or r["_tile"].heads <= heads_at_most)]
            return min(rows, key=lambda r: r["relative"])["_tile"] if rows else None

        decode = best("decode-h16") or self.base.decode
        wide_decode = best("decode-h128")
        extend_any, extend_narrow = best("extend-h128"), best("extend-h128", heads_at_most=16)
        extend = extend_narrow or self.base.extend
        rules = []
        if wide_decode is not None and wide_decode != decode:
            rules.append(TileRule("decode", 64, wide_decode))
        if extend_any is not None and extend_any != extend:
            rules.append(TileRule("extend", 64, extend_any))
        config = dataclasses.replace(self.base, name="h200-measured", decode=decode, extend=extend, rules=tuple(rules))
        for row in self.samples:
            row.pop("_tile", None)
        return config

    def _summary(self, winners: dict) -> dict:
        summary = {}
        for workload in WORKLOADS:
            rows = winners[workload.name]
            current = [r for r in rows if r["kernel"] == "current" and "relative" in r]
            failed = sum(1 for r in rows if "error" in r or r.get("correct") is False)
            entry = {"points": [list(p) for p in workload.points], "heads": workload.heads,
                     "candidates": len(rows), "failed": failed, "skipped": sum(1 for r in rows if "skipped" in r)}
            if current:
                win = min(current, key=lambda r: r["relative"])
                entry.update(winner=win.get("tile_used", win["tile"]), winner_ms=win["ms"], winner_rates=win["rates"])
            summary[workload.name] = entry
        return summary


def kernels_plan(kernels, workload: Workload, point) -> int:
    """The split count the entry point chose at this point (its plan cache is keyed by rows,
    heads, requests, table width, ...)."""
    plans = getattr(kernels, workload.entry).keywords["plans"]
    rows, context = point
    for key, (_, splits) in plans.items():
        if (key[0], key[1], key[3]) == (rows, workload.heads, context // gt.PAGE):
            return splits
    return 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _report(row: dict) -> None:
    if "error" in row:
        what = row["error"]
    elif row.get("correct") is False:
        what = f"WRONG {row.get('check')}"
    else:
        what = " ".join(f"{t:.3f}ms" for t in row.get("ms", [])) + "  " + " ".join(
            str(r.get("kv_gbps") or r.get("tflops")) for r in row.get("rates", []))
    print(f"  sweep {row['workload']:11s} {row['kernel'][:8]:8s} {row.get('tile_used', row['tile']):18s} "
          f"{row['seconds']:5.1f}s  {what}", flush=True)
