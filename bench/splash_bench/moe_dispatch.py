"""The rank side of bench/moe_dispatch.py: one MoE layer at real widths with seeded weights, both
paths to its experts timed on this rank, and the floors they are held to."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from splash_core import dtypes
from splash_core.model.experts import route
from splash_core.model.fp8_blocks import gemm_mismatch, relative_error
from splash_core.model.weights import SeededWeights
from splash_core.profiles.checkpoint_config import profile_from_checkpoint
from splash_core.profiles.loader import load
from splash_core.runtime.feed_forward import MoE
from splash_core.studies.calibrate import Sizes, collective_samples, fit_collectives, timed

from .decode_step import device_rates


def model_profile(args):
    """The model profile named by ``--model``, or a checkpoint folder's."""
    profile = profile_from_checkpoint(args.model) if Path(args.model).is_dir() else load("model", args.model)
    if profile.moe is None:
        raise SystemExit(f"model {args.model!r} has no routed experts")
    return profile


def measure(ctx, args) -> dict:
    """This rank's times of both paths per row count, the experts' work it did, and the group's rates."""
    profile, T, dtype = model_profile(args), ctx.world_size, dtypes.torch_dtype(args.dtype)
    layer = profile.moe.first_k_dense_replace
    mlp = MoE.load(SeededWeights(args.seed), profile, layer, ctx.rank, T, device=ctx.device, dtype=dtype,
                   shared_whole=True)
    coll, d = ctx.collectives, profile.hidden_size
    rates = device_rates(ctx, args.copy_mib, args.matmul_n, dtype, args.reps)
    rates.update(fit_collectives(collective_samples(coll, ctx.device, Sizes.choose(ctx.device.type != "cpu", True),
                                                    ctx.streams)))
    points = []
    for rows in args.rows:
        own = rows // T
        gen = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
        x = torch.randn(own, d, generator=gen, device=ctx.device).to(dtype)

        def all_reduce_path():
            every = x.new_empty(T * own, d)
            coll.all_gather_into(every, x)
            return mlp.forward(every, coll)

        def all_to_all_path():
            out = mlp.forward_owned(x, coll)
            every = out.new_empty(T * own, d)
            coll.all_gather_into(every, out)
            return every

        got, want = all_to_all_path(), all_reduce_path()
        mismatch, error = gemm_mismatch(got, want, args.tolerance), relative_error(got, want)
        times = {name: 1e3 * statistics.median(timed(fn, ctx.streams, args.reps, before=coll.barrier))
                 for name, fn in (("all_reduce", all_reduce_path), ("all_to_all", all_to_all_path))}
        _, chosen = route(x, mlp.router, mlp.bias, profile.moe)
        per = -(-profile.moe.n_routed_experts // T)
        crossing = torch.zeros(own, T, dtype=torch.bool, device=ctx.device).scatter_(1, chosen // per, True)
        crossing[:, ctx.rank] = False  # rows this rank sends away (each once per destination rank)
        points.append({"rows": own * T, "ms": times, "mismatch": mismatch, "error": error,
                       "sent_rows": int(crossing.sum()),
                       "pairs_here": _pairs_here(coll, chosen, mlp.experts)})
    return {"points": points, "rates": rates}


def _pairs_here(coll, chosen, experts: range) -> int:
    """Routed pairs of all ranks' rows that land on this rank's experts."""
    mine = ((chosen >= experts.start) & (chosen < experts.stop)).sum().reshape(1)
    every = mine.new_empty(coll.size)
    coll.all_gather_into(every, mine)
    return int(every.sum())


def floors(profile, T: int, act_bytes: int, rates: dict, rows: int, sent_rows: int, pairs_here: int) -> dict:
    """Each path's floor (ms) for one rank: its collective bytes at the measured link rates and its
    collectives' measured latency (two, and four with the counts' exchange), plus the experts' work
    (the same in both) at the measured matmul or copy rate."""
    d, moe = profile.hidden_size, profile.moe
    row, per_expert = d * act_bytes, 3 * d * moe.moe_intermediate_size
    shared_rows = -(-rows // T)
    flops = 2 * per_expert * (pairs_here + moe.n_shared_experts * shared_rows)
    held = -(-moe.n_routed_experts // T) + moe.n_shared_experts
    experts_ms = max(flops / (rates["matmul_tflops"] * 1e9), held * per_expert * act_bytes / (rates["copy_gbps"] * 1e6))
    gather_ms = rows * (T - 1) / T * row / (rates["all_gather_gbps"] * 1e6)
    reduce_ms = rows * row / (rates["all_reduce_gbps"] * 1e6)
    metadata = moe.num_experts_per_tok * 8
    a2a_ms = sent_rows * (2 * row + metadata) / (rates["all_to_all_gbps"] * 1e6)
    lat_ms = rates["collective_latency_us"] * 1e-3
    return {"all_reduce": experts_ms + gather_ms + reduce_ms + 2 * lat_ms,
            "all_to_all": experts_ms + a2a_ms + gather_ms + 4 * lat_ms, "experts": experts_ms}


