#!/usr/bin/env python
"""How long the runs of consecutive pages are that serving leaves a request's KV history in:
what decides whether a live switch pulls a layer's pages (one copy per run, worth it where runs
average ``--min-run-bytes``: the cuda backend's ``CudaPeerBuffers.min_run_bytes``, 4 MiB) or
moves them by collectives.

The pool of one layer on one rank (:class:`~splash_core.runtime.block_tables.BlockTables`, the
allocator the runtime uses) is driven through the page openings and releases of a simulated
serving run, in the order the engine makes them: every step, each request in the batch's order
allocates the pages its new tokens open (chunked prefill: ``--chunk`` tokens a step; decode: one
token a step, a page every ``--page-size`` tokens), and a finished request frees its pages after
its last step. Scenarios:

- ``rollout``: an RL rollout. ``--batch`` requests start together (prompts ``--prompt`` tokens,
  outputs ``--output``, uniform draws) and none arrive later; snapshots as the batch shrinks to
  half, a quarter, two and one requests (where a scheduler moves the last long requests to
  another layout).
- ``serving``: a steady batch, each finished request replaced at once by a new one;
  ``--snapshots`` snapshots spread over ``--steps`` steps.

Per snapshot, over the requests in the batch: pages; runs of physical pages in logical order at
a constant step (``runs``: what one pitched copy takes, as pulls cut them by default;
``plain_runs``: consecutive pages only), i.e. the copies a pull of whole histories takes on the
sending side; pages per run; and whether the pull rule
(:func:`splash_core.runtime.switch.page_pulls.worth_pulling`) would take them, counting as many
runs on the receiving side. No device and no ranks: runs in seconds anywhere. Writes
``<out>/cpu/page_runs.json`` (command, machine, date, every snapshot).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # uninstalled checkout

from splash_core import results  # noqa: E402
from splash_core.runtime.block_tables import BlockTables  # noqa: E402
from splash_core.runtime.switch.page_pulls import runs, worth_pulling  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Request:
    id: int
    arrival: int  # the step of its first prefill chunk
    prompt: int  # tokens
    output: int  # tokens


def _span(text: str) -> tuple[int, int]:
    a, _, b = text.partition("-")
    return int(a), int(b or a)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results", help="results root; the file goes to <out>/cpu/")
    p.add_argument("--scenarios", default="rollout,serving")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt", default="512-8192", help="prompt tokens, uniform in LO-HI")
    p.add_argument("--output", default="4096-122880", help="output tokens, uniform in LO-HI")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--page-bytes", type=int, default=64 * 576 * 2, help="bytes of one page (DeepSeek-V3 latent KV, bf16)")
    p.add_argument("--chunk", type=int, default=2048, help="prefill tokens per request per step")
    p.add_argument("--pool-pages", type=int, default=None,
                   help="pages of the pool (default: the batch at the longest prompt + output)")
    p.add_argument("--tight", type=float, default=0.05, help="the tight pool's headroom over the roomy run's peak")
    p.add_argument("--steps", type=int, default=200_000, help="serving: steps simulated")
    p.add_argument("--snapshots", type=int, default=8, help="serving: snapshots")
    p.add_argument("--min-run-bytes", type=float, default=4 << 20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default="", help="suffix of the result file's name")
    p.add_argument("--note", default="", help="what this run is, put first in the result's notes (an A/B's side)")
    p.add_argument("--no-write", action="store_true")
    return p.parse_args(argv)


def draw(rng, span: tuple[int, int]) -> int:
    return int(rng.integers(span[0], span[1] + 1))


def openings(req: Request, page_size: int, chunk: int) -> tuple[list[tuple[int, np.ndarray]], int]:
    """(step, logical pages) of every allocation ``req`` makes, and the step after which it ends."""
    total = req.prompt + req.output
    pages = np.arange(-(-total // page_size))
    first_token = pages * page_size  # a page opens with its first token
    prefill_steps = -(-req.prompt // chunk)
    step = np.where(first_token < req.prompt, req.arrival + first_token // chunk,
                    req.arrival + prefill_steps + first_token - req.prompt)
    cuts = np.flatnonzero(np.diff(step)) + 1
    groups = [(int(s[0]), p) for s, p in zip(np.split(step, cuts), np.split(pages, cuts))]
    return groups, req.arrival + prefill_steps + req.output - 1


def snapshot(pool: BlockTables, active: list[int], step: int, page_bytes: int, min_run_bytes: float) -> dict:
    per_request = []
    for rid in active:
        _, physical = pool.pages_of(rid)
        per_request.append((int(physical.size), int(len(runs(physical))), int(len(runs(physical, pitched=False)))))
    pages = sum(p for p, _, _ in per_request)
    copies = sum(c for _, c, _ in per_request)
    per_run = [p / c for p, c, _ in per_request if c]
    return {"step": step, "requests": len(active), "pages": pages, "runs": copies,
            "plain_runs": sum(c for _, _, c in per_request),
            "pages_per_run": pages / copies if copies else 0.0,
            "median_request_pages_per_run": statistics.median(per_run) if per_run else 0.0,
            "worst_request_pages_per_run": min(per_run) if per_run else 0.0,
            # the agreement counts the receiver's runs too: here as many as the sender's
            "pulled": worth_pulling(pages, 2 * copies, page_bytes, min_run_bytes),
            "per_request": per_request}


def simulate(requests: list[Request], pool_pages: int, args, snapshot_at, arrivals=None) -> tuple[list[dict], int]:
    """Drive one pool through ``requests`` (and the ones ``arrivals(step, finished)`` adds);
    ``snapshot_at(step, active)`` says when to take a snapshot (after a step's work). Returns
    the snapshots and the most pages ever in use."""
    pool = BlockTables(0, pool_pages)
    events: dict[int, list] = {}

    def add(req: Request) -> None:
        groups, end = openings(req, args.page_size, args.chunk)
        for step, pages in groups:
            events.setdefault(step, []).append((0, req.id, pages))
        events.setdefault(end, []).append((1, req.id, None))

    for req in requests:
        add(req)
    active, out, step, peak = {r.id for r in requests}, [], 0, 0
    while events:
        step = min(events)
        finished = []
        for kind, rid, pages in sorted(events.pop(step), key=lambda e: (e[0], e[1])):
            if kind == 0:
                pool.alloc(rid, pages)
                peak = max(peak, pool.used_pages)
            else:
                pool.free(rid)
                active.discard(rid)
                finished.append(rid)
        for req in (arrivals(step, finished) if arrivals else []):
            add(req)
            active.add(req.id)
        if snapshot_at(step, sorted(active)):
            out.append(snapshot(pool, sorted(active), step, args.page_bytes, args.min_run_bytes))
    return out, peak


def rollout(args, rng, pool_pages: int) -> tuple[list[dict], int]:
    prompt, output = _span(args.prompt), _span(args.output)
    reqs = [Request(i, 0, draw(rng, prompt), draw(rng, output)) for i in range(args.batch)]
    left = sorted({max(1, args.batch // 2), max(1, args.batch // 4), 2, 1}, reverse=True)

    def at(step, active):
        if left and 0 < len(active) <= left[0]:
            while left and len(active) <= left[0]:
                left.pop(0)
            return True
        return False

    return simulate(reqs, pool_pages, args, at)


def serving(args, rng, pool_pages: int) -> tuple[list[dict], int]:
    prompt, output = _span(args.prompt), _span(args.output)
    reqs = [Request(i, int(rng.integers(0, 64)), draw(rng, prompt), draw(rng, output)) for i in range(args.batch)]
    ids = iter(range(args.batch, 1 << 30))
    marks = list(np.linspace(args.steps / args.snapshots, args.steps, args.snapshots).astype(int))

    def arrivals(step, finished):
        if step >= args.steps:
            return []
        return [Request(next(ids), step + 1, draw(rng, prompt), draw(rng, output)) for _ in finished]

    def at(step, active):
        if marks and step >= marks[0]:
            while marks and step >= marks[0]:
                marks.pop(0)
            return True
        return False

    return simulate(reqs, pool_pages, args, at, arrivals)


SCENARIOS = {"rollout": rollout, "serving": serving}


def run(args) -> list[dict]:
    """Each scenario in a roomy pool (``--pool-pages``, default: room for the whole batch at the
    longest lengths), then the same requests in a tight one (``--tight`` more pages than the
    roomy run ever used)."""
    prompt, output = _span(args.prompt), _span(args.output)
    roomy = args.pool_pages or args.batch * -(-(prompt[1] + output[1]) // args.page_size)
    out = []
    for name in args.scenarios.split(","):
        pool_pages = roomy
        for fit in ("roomy", "tight"):
            start = time.time()
            snaps, peak = SCENARIOS[name](args, np.random.default_rng(args.seed), pool_pages)
            out.append({"scenario": name, "pool": fit, "pool_pages": pool_pages, "peak_used_pages": peak,
                        "snapshots": snaps})
            print(f"{name}, {fit} pool of {pool_pages} pages, at most {peak} used ({time.time() - start:.1f} s)")
            for s in snaps:
                print(f"  step {s['step']:>7}: {s['requests']:>3} requests, {s['pages']:>6} pages in {s['runs']:>6} "
                      f"runs, {s['plain_runs']:>6} plain ({s['pages_per_run']:.1f} pages a run, worst request "
                      f"{s['worst_request_pages_per_run']:.1f}); {'pulled' if s['pulled'] else 'by collectives'}")
            pool_pages = int(np.ceil(peak * (1 + args.tight)))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    cases = run(args)
    if args.no_write:
        return 0
    rows = [{"scenario": c["scenario"], "pool": c["pool"], "pool_pages": c["pool_pages"],
             "peak_used_pages": c["peak_used_pages"], **{k: v for k, v in s.items() if k != "per_request"}}
            for c in cases for s in c["snapshots"]]
    data = results.make_result(
        benchmark="page_runs", platform="cpu", backend="none", model="deepseek-v3", T=1, dtype="bf16",
        samples=[{"scenario": c["scenario"], "pool": c["pool"], "step": s["step"], "per_request": s["per_request"]}
                 for c in cases for s in c["snapshots"]],
        summary={"page_bytes": args.page_bytes, "min_run_bytes": args.min_run_bytes, "rows": rows},
        extra={"args": vars(args)},
        notes=(f"{args.note}: " if args.note else "")
        + ("simulated page openings and releases of a serving run on one layer's pool (the runtime's "
           "BlockTables allocator); runs = runs of each request's physical pages in logical order at a "
           "constant step (one pitched copy each), plain_runs = runs of consecutive pages; pulled = whether "
           "the pull rule takes a whole-history pull of the batch, counting as many runs on the receiving "
           "side; samples: (pages, runs, plain runs) per request"))
    print("wrote", results.write_result(data, args.out, name=f"page_runs{args.tag}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
