"""Probe: can the side communicator move a switch's state without taking processors from compute?

NCCL >= 2.28 runs all-gather (and, where it can, all-to-all) on the copy engines when the
communicator's CTA policy is "zero" and the buffers are registered symmetric memory (torch's
``torch.distributed._symmetric_memory`` with the NCCL backend). On two GPUs, for each transport
(``sm``: a plain NCCL communicator and buffers; ``ce``: zero-CTA policy and symmetric buffers):

- each collective alone (all-gather of a layer's weights and of its KV, all-to-all of its KV,
  even and uneven), p50 over ``--runs``, and which device kernels ran for it (profiler);
- a matmul loop alone, and with the collectives repeated beside it on a high-priority side
  stream: how much the matmuls slowed, and how long the collectives took meanwhile.

Every rank issues the same collectives in the same order (counts are agreed by an all-reduce):
a probe that let ranks disagree would hang. Writes ``<out>/transport_probe.json`` (command,
machine, date, raw samples per rank) as ``<out>/<platform>/transport_probe.json``. Needs 2 CUDA
GPUs and the project installed (``bash bench/run_h200.sh transport``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MiB = 1 << 20


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _side_group(transport: str):
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    if transport == "ce":
        opts.config.cta_policy = dist.ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO
    return dist.new_group([0, 1], backend="nccl", pg_options=opts)


def _buffers(transport: str, group, shapes: dict, device) -> dict:
    """Named uint8 buffers; symmetric memory registered on ``group`` for ``ce``."""
    if transport != "ce":
        return {k: torch.empty(n, dtype=torch.uint8, device=device) for k, n in shapes.items()}
    import torch.distributed._symmetric_memory as symm_mem

    symm_mem.set_backend("NCCL")
    out = {}
    for k, n in shapes.items():
        out[k] = symm_mem.empty(n, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(out[k], group=group.group_name)
    return out


def _ops(bufs: dict, rank: int, group, wg: int, kv: int) -> dict:
    """name -> callable issuing one collective on the current stream (async; returns its work)."""
    q = kv // 4
    send = [q, 3 * q]  # rank 0 keeps q and sends 3q; rank 1 sends q and keeps 3q
    recv = [q, q] if rank == 0 else [3 * q, 3 * q]
    return {
        "allgather_weights": lambda: dist.all_gather_into_tensor(
            bufs["wout"], bufs["wout"][rank * wg: (rank + 1) * wg], group=group, async_op=True),
        "allgather_kv": lambda: dist.all_gather_into_tensor(
            bufs["kout"], bufs["kout"][rank * kv: (rank + 1) * kv], group=group, async_op=True),
        "alltoall_kv_even": lambda: dist.all_to_all_single(
            bufs["aout"][:kv], bufs["ain"][:kv], group=group, async_op=True),
        "alltoall_kv_uneven": lambda: dist.all_to_all_single(
            bufs["aout"][: sum(recv)], bufs["ain"][: sum(send)], recv, send, group=group, async_op=True),
    }


def _agreed_max(value: float, device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _time_op(op, stream, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = _events()
        with torch.cuda.stream(stream):
            a.record(stream)
            op().wait()
            b.record(stream)
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def _kernels_of(op, stream) -> list[str]:
    """Device kernels the profiler saw while ``op`` ran (none: copy engines only)."""
    from torch.profiler import ProfilerActivity, profile

    dist.barrier()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.cuda.stream(stream):
            op().wait()
        torch.cuda.synchronize()
    return sorted({e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def _matmuls(a, b, n: int) -> None:
    for _ in range(n):
        torch.mm(a, b)


def _concurrent(op, side, a, b, n_mm: int, repeat: int, runs: int) -> tuple[list[float], list[float]]:
    """(matmul ms, collectives ms) per run, ``repeat`` collectives beside ``n_mm`` matmuls."""
    mm, coll = [], []
    compute = torch.cuda.current_stream()
    for _ in range(runs):
        dist.barrier()
        torch.cuda.synchronize()
        (m0, m1), (c0, c1), start = _events(), _events(), torch.cuda.Event()
        m0.record(compute)
        start.record(compute)
        side.wait_event(start)
        with torch.cuda.stream(side):
            c0.record(side)
            for _ in range(repeat):
                op().wait()
            c1.record(side)
        _matmuls(a, b, n_mm)
        m1.record(compute)
        torch.cuda.synchronize()
        mm.append(m0.elapsed_time(m1))
        coll.append(c0.elapsed_time(c1))
    return mm, coll


def _save(out: str, result: dict) -> None:
    """What this rank measured so far (kept if a later collective hangs)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"partial-rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)


def _rank(rank: int, args, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=device)
    wg, kv = args.weights_mib * MiB // 2, args.kv_mib * MiB // 2
    shapes = {"wout": 2 * wg, "kout": 2 * kv, "ain": 2 * kv, "aout": 2 * kv}
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    _matmuls(a, b, 3)
    torch.cuda.synchronize()
    result = {"rank": rank, "matmul_alone_ms": [], "transports": {}}
    for _ in range(args.runs):
        m0, m1 = _events()
        m0.record()
        _matmuls(a, b, args.matmuls)
        m1.record()
        m1.synchronize()
        result["matmul_alone_ms"].append(m0.elapsed_time(m1))
    mm_alone = _agreed_max(statistics.median(result["matmul_alone_ms"]), device)
    for transport in args.transports:
        entry = result["transports"].setdefault(transport, {})
        print(f"rank {rank}: {transport}", flush=True)
        try:  # the options and symmetric memory fail alike on both ranks, before any collective
            group = _side_group(transport)
            bufs = _buffers(transport, group, shapes, device)
        except Exception as exc:  # noqa: BLE001 - recorded, the probe goes on
            entry["error"] = f"{type(exc).__name__}: {exc}"[:800]
            _save(args.out, result)
            continue
        for buf in bufs.values():
            buf.random_(0, 255)
        side = torch.cuda.Stream(device=device, priority=-1)
        for name, op in _ops(bufs, rank, group, wg, kv).items():
            print(f"rank {rank}: {transport} {name}", flush=True)
            rec = entry[name] = {}
            try:  # an error on one rank only leaves the other waiting: the parent's timeout ends it
                rec["alone_ms"] = _time_op(op, side, args.runs)
                rec["kernels"] = _kernels_of(op, side)
                alone = _agreed_max(statistics.median(rec["alone_ms"]), device)
                rec["repeat"] = repeat = max(1, int(mm_alone / max(alone, 1e-3)))
                rec["with_matmul_ms"], rec["beside_matmul_ms"] = _concurrent(op, side, a, b, args.matmuls, repeat,
                                                                             args.runs)
            except Exception as exc:  # noqa: BLE001 - recorded
                rec["error"] = f"{type(exc).__name__}: {exc}"[:800]
            _save(args.out, result)
    print(f"rank {rank}: done", flush=True)
    sys.stdout.flush()
    os._exit(0)  # no teardown: destroying several communicators can hang, and nothing is left to do


def _summary(results: list[dict]) -> list[dict]:
    def p50(xs):
        return round(statistics.median(xs), 3)

    if not all(r["matmul_alone_ms"] for r in results):
        return [{"error": "a rank measured nothing"}]
    mm = max(p50(r["matmul_alone_ms"]) for r in results)
    rows = []
    for transport, ops in results[0]["transports"].items():
        if "error" in ops:
            rows.append({"transport": transport, "error": ops["error"]})
            continue
        for name in ops:
            recs = [r["transports"].get(transport, {}).get(name, {}) for r in results]
            if any("beside_matmul_ms" not in x for x in recs):
                rows.append({"transport": transport, "op": name,
                             "error": next((x["error"] for x in recs if "error" in x), "not finished")})
                continue
            alone, repeat = max(p50(x["alone_ms"]) for x in recs), recs[0]["repeat"]
            with_mm = max(p50(x["with_matmul_ms"]) for x in recs)
            beside = max(p50(x["beside_matmul_ms"]) for x in recs)
            rows.append({"transport": transport, "op": name, "alone_ms": alone, "kernels": recs[0]["kernels"],
                         "repeat": repeat, "matmul_alone_ms": mm, "matmul_with_ms": with_mm,
                         "matmul_slowdown_pct": round(100 * (with_mm / mm - 1), 2), "collectives_beside_ms": beside,
                         "collective_slowdown_pct": round(100 * (beside / (alone * repeat) - 1), 2)})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--platform", default="h200x2")
    p.add_argument("--transports", default="sm,ce")
    p.add_argument("--weights-mib", type=int, default=164, help="all-gather output per layer (weights)")
    p.add_argument("--kv-mib", type=int, default=576, help="all-gather output and all-to-all size (KV)")
    p.add_argument("--matmuls", type=int, default=20, help="8192^3 bf16 matmuls per timed loop")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=240.0, help="give up on the ranks after this long")
    args = p.parse_args(argv)
    args.transports = args.transports.split(",")
    if torch.cuda.device_count() < 2:
        sys.exit("transport_probe needs 2 CUDA GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, args, port)) for r in range(2)]
    for proc in procs:
        proc.start()
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=args.timeout_s)
    for proc in procs:
        proc.join(timeout=max(1.0, (deadline - datetime.datetime.now()).total_seconds()))
    hung = [proc for proc in procs if proc.is_alive()]
    for proc in hung:
        proc.kill()
    results = []
    for r in range(2):
        try:
            with open(os.path.join(args.out, f"partial-rank{r}.json")) as f:
                results.append(json.load(f))
        except OSError:
            results.append({"rank": r, "matmul_alone_ms": [], "transports": {}, "error": "no results"})
    from splash_core.results import make_result, write_result

    notes = ("p50 per rank; summary: slowest rank. Matmul loop: 8192^3 bf16 x --matmuls; the collectives "
             "repeated beside it on a high-priority side stream. backend/model: raw torch.distributed NCCL, "
             "no SPLASH backend or model." + (" Ranks hung and were killed; partial results." if hung else ""))
    doc = make_result(benchmark="transport_probe", platform=args.platform, backend="none", model="none", T=2,
                      dtype="uint8", samples=results, summary={"rows": _summary(results)}, notes=notes,
                      command="python3 " + " ".join(sys.argv),
                      machine=f"{socket.gethostname()}, torch {torch.__version__}, "
                              f"nccl {'.'.join(map(str, torch.cuda.nccl.version()))}, 2x {torch.cuda.get_device_name(0)}")
    path = write_result(doc, root=args.out)
    for row in doc["summary"]["rows"]:
        print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), "kernels:", row.get("kernels", [])[:2])
    print("wrote", path)


if __name__ == "__main__":
    main()
