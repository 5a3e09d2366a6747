"""Shared pieces of the live-switching tests: a serving loop with staggered arrivals and unequal
lengths, its single-process reference, and checks of a rank's state."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import torch

from splash_core.model.weights import SeededWeights
from splash_core.planning import ownership
from splash_core.profiles.loader import load
from splash_core.profiles.transfer import TransferConfig
from splash_core.runtime.kv_pool import held_pages
from splash_core.runtime.reference_model import ReferenceModel
from splash_core.runtime.step_batch import StepBatch, StepRequest
from splash_core.runtime.switch import Mode

PAGE, CHUNK, SEED = 16, 16, 7
MODEL = "tiny-mla"
# the reference backend's pools in peer memory, and pages pulled wherever they are shared,
# however short their runs (the tests' pages are tiny)
PULLS = TransferConfig(peer_pulls=True, min_run_bytes=0)


@dataclasses.dataclass(frozen=True)
class Req:
    """A request: prompt, owner, tokens to generate, and the step it arrives at."""

    id: int
    owner: int
    prompt: tuple[int, ...]
    new_tokens: int
    arrives: int = 0


def prompt(length: int, seed: int) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(0, 256, length))


@dataclasses.dataclass
class Served:
    """Per request: the logits of every step it took part in, and its greedy tokens."""

    logits: dict[int, list[np.ndarray]]
    tokens: dict[int, list[int]]
    steps: int


def serve(step: Callable[[int, StepBatch, torch.Tensor], torch.Tensor], reqs, T: int,
          release: Callable[[int], None] | None = None) -> Served:
    """Chunked prefill then greedy decode; ``step(k, batch, tokens)`` runs step k. A request joins
    at its ``arrives`` step and is released right after the step that gives its last token."""
    fed = {r.id: 0 for r in reqs}
    out = Served({r.id: [] for r in reqs}, {r.id: [] for r in reqs}, 0)
    pending, active, k = sorted(reqs, key=lambda r: r.arrives), [], 0
    while pending or active:
        active += [r for r in pending if r.arrives <= k]
        pending = [r for r in pending if r.arrives > k]
        if not active:
            k += 1
            continue
        feed, entries = {}, []
        for r in active:
            if fed[r.id] < len(r.prompt):
                feed[r.id] = list(r.prompt[fed[r.id]: fed[r.id] + CHUNK])
            else:
                feed[r.id] = [out.tokens[r.id][-1]]
            entries.append(StepRequest(r.id, r.owner if T > 1 else 0, fed[r.id], len(feed[r.id])))
        batch = StepBatch.build(entries, T, PAGE)
        tokens = torch.tensor([t for q in batch.requests for t in feed[q.id]], dtype=torch.int64)
        logits = step(k, batch, tokens).float().cpu().numpy()
        for row, q in enumerate(batch.requests):
            out.logits[q.id].append(logits[row])
            fed[q.id] += q.rows
            if fed[q.id] >= len(next(r for r in active if r.id == q.id).prompt):
                out.tokens[q.id].append(int(np.argmax(logits[row])))
        for r in [r for r in active if len(out.tokens[r.id]) >= r.new_tokens]:
            active.remove(r)
            if release is not None:
                release(r.id)
        k += 1
    out.steps = k
    return out


def reference(reqs) -> Served:
    """The same requests through the single-process reference model (layout-free)."""
    ref = ReferenceModel(load("model", MODEL), SeededWeights(SEED))
    return serve(lambda k, b, t: ref.step(b, t), reqs, 1, ref.release)


def assert_matches(got: Served, want: Served, label: str, atol: float = 1e-4) -> None:
    assert got.tokens == want.tokens, f"{label}: tokens differ"
    for rid in want.logits:
        assert len(got.logits[rid]) == len(want.logits[rid]), f"{label}: request {rid} took a different number of steps"
        for j, (a, b) in enumerate(zip(got.logits[rid], want.logits[rid])):
            np.testing.assert_allclose(a, b, rtol=atol, atol=atol, err_msg=f"{label}: request {rid} step {j}")


# ---- rank-side checks ----------------------------------------------------------------------

def planned_bytes(executor, dst, batch, mode, state) -> int:
    """Bytes of ``state`` the group receives in the switch: the manifest of the histories before
    the step, except that in splash the first layer moves its history after the step (it
    computes the step in its source layout, then moves last)."""
    manifest = executor.plan(dst, batch)
    total = int(manifest.fetched_bytes(state).sum())
    first = executor.model.layers[0].index
    if Mode(mode) is Mode.SPLASH and executor.transfer.defer_first and state in manifest.layer(first).states:
        (after,) = executor.plans(dst, batch, after_step=True, layers=(first,)).values()
        total += int(after.layer(first).states[state].fetched_bytes.sum()
                     - manifest.layer(first).states[state].fetched_bytes.sum())
    return total


def accounting_problems(model, batch: StepBatch, rank: int) -> list[str]:
    """Where this rank's state differs from its layers' layouts after ``batch``'s step: pages held
    (``check_placement``), per-layer weights/KV/indexer bytes and pool pages against
    ``ownership.footprint``, and ``model.nbytes()`` against the whole footprint."""
    profile, T = model.profile, model.T
    problems = []
    try:
        model.check_placement(batch)
    except AssertionError as exc:
        problems.append(str(exc))
    hist = batch.ownership_batch()
    totals = {"weights": 0, "kv": 0, "indexer": 0}
    for layer in model.layers:
        fp = ownership.footprint(layer.layout, hist, profile, T, PAGE, layers=[layer.index])
        pages = ownership.kv_pages_per_rank(layer.layout, hist, T, PAGE)[rank]
        held = layer.nbytes()
        got = (held["projections"], held["kv"], held["indexer"], layer.kv.used_pages)
        want = (fp.weights[rank], fp.kv[rank], fp.indexer[rank], pages)
        if got != want:
            problems.append(f"layer {layer.index} ({layer.layout}): holds {got}, footprint says {want}")
        for key, value in zip(("weights", "kv", "indexer"), want[:3]):
            totals[key] += int(value)
    nbytes = model.nbytes()
    if {k: nbytes[k] for k in totals} != totals:
        problems.append(f"model.nbytes() {nbytes} differs from the footprint {totals}")
    return problems


def snapshot(model) -> list[dict]:
    """Everything a switch may change, per layer: layout, projection tensors, block tables and
    the contents of every held page."""
    out = []
    for layer in model.layers:
        tables = {}
        for rid in layer.kv.requests:
            logical, physical = layer.kv.pages_of(rid)
            idx = torch.as_tensor(physical)
            tables[rid] = (logical.tolist(), physical.tolist(), layer.kv.kv[idx].clone(),
                           None if layer.kv.indexer is None else layer.kv.indexer[idx].clone())
        w = layer.weights
        out.append({"layout": layer.layout, "heads": w.heads, "weights": [getattr(w, n).clone() for n in w.SHARDED],
                    "tables": tables, "free": layer.kv.free_pages})
    return out


def snapshot_diff(before: dict, after: dict) -> str | None:
    """How one layer's snapshot changed, or None."""
    for key in ("layout", "heads", "free"):
        if before[key] != after[key]:
            return f"{key}: {before[key]} -> {after[key]}"
    if any(not torch.equal(a, b) for a, b in zip(before["weights"], after["weights"])):
        return "weights changed"
    if before["tables"].keys() != after["tables"].keys():
        return f"requests {sorted(before['tables'])} -> {sorted(after['tables'])}"
    for rid, (lg, ph, kv, idx) in before["tables"].items():
        lg2, ph2, kv2, idx2 = after["tables"][rid]
        if (lg, ph) != (lg2, ph2):
            return f"request {rid}: pages {lg}/{ph} -> {lg2}/{ph2}"
        if not torch.equal(kv, kv2) or (idx is not None and not torch.equal(idx, idx2)):
            return f"request {rid}: page contents changed"
    return None


def history_problems(model, batch: StepBatch, rank: int) -> list[str]:
    """Whether each layer holds exactly its layout's pages of each request's history *before*
    ``batch``'s step (what a failed switching step must leave)."""
    problems = []
    for layer in model.layers:
        for rid, owner, start in zip(batch.ids, batch.owners, batch.starts):
            want = held_pages(layer.layout, int(rid), int(owner), np.arange(-(-int(start) // PAGE)), rank, model.T)
            have, _ = layer.kv.pages_of(int(rid))
            if not np.array_equal(np.sort(have), want):
                problems.append(f"layer {layer.index} ({layer.layout}) request {rid}: {have.tolist()} != {want.tolist()}")
    return problems
