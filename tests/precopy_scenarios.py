"""Shared pieces of the pre-copy tests: what a rank must hold while a pre-copy runs."""

from __future__ import annotations

import numpy as np
from switch_scenarios import PAGE, accounting_problems

from splash_core.runtime.kv_pool import held_pages
from splash_core.runtime.switch.precopy import shadow_id


def precopy_problems(model, precopy, batch, rank: int) -> list[str]:
    """Where this rank differs from a pre-copy in progress after ``batch``'s step: every layer holds
    exactly its layout's pages of each request under the request's id (the source layout serves
    on untouched), and each layer whose copy landed holds, under the shadow id, exactly the
    destination's pages of the copied prefix that the source does not give it; nothing else."""
    problems = []
    ids = {int(i) for i in batch.ids}
    for layer in model.paged_layers:
        for rid, owner, ctx in zip(batch.ids, batch.owners, batch.contexts):
            rid, owner = int(rid), int(owner)
            want = held_pages(layer.layout, rid, owner, np.arange(-(-int(ctx) // PAGE)), rank, model.T)
            have = np.sort(layer.kv.pages_of(rid)[0])
            if not np.array_equal(have, want):
                problems.append(f"layer {layer.index} request {rid}: holds {have.tolist()}, its layout {want.tolist()}")
            prefix = np.arange(precopy.prefix.get(rid, 0) if layer.index in precopy.holding else 0)
            copies = np.setdiff1d(held_pages(precopy.dst, rid, owner, prefix, rank, model.T),
                                  held_pages(layer.layout, rid, owner, prefix, rank, model.T))
            shadow = np.sort(layer.kv.pages_of(shadow_id(rid))[0])
            if not np.array_equal(shadow, copies):
                problems.append(f"layer {layer.index} request {rid}: copies {shadow.tolist()}, want {copies.tolist()}")
        stray = {r for r in layer.kv.requests if (r if r >= 0 else -1 - r) not in ids}
        if stray:
            problems.append(f"layer {layer.index} holds pages of {sorted(stray)}, not in the batch")
        expected = sum(len(layer.kv.pages_of(r)[0]) for r in layer.kv.requests)
        if layer.kv.used_pages != expected:
            problems.append(f"layer {layer.index}: {layer.kv.used_pages} pages used, tables list {expected}")
    return problems


def releasing(model, live: dict):
    """``release(rid)`` for a serving loop: the model's pages, and the running pre-copy's (``live["pc"]``) copies."""
    def release(rid):
        model.release(rid)
        if live.get("pc") is not None:
            live["pc"].release(rid)

    return release


def precopy_step(model, executor, dst, rank: int, live: dict, problems: list, *, start: int, steps: int,
                 handoff: int, on_copy, at_handoff=None):
    """A step function for ``serve``: ``model`` steps in its layouts; from step ``start`` a pre-copy
    into ``dst`` over ``steps`` steps serves them (``on_copy(report)`` of each, its holdings checked by
    :func:`precopy_problems`), kept in ``live["pc"]``; step ``handoff`` switches with it
    (``at_handoff(pc, batch, tokens)`` returns that step's logits; by default the executor's step).
    Every other step's page accounting is checked too; what is wrong goes to ``problems``."""
    def step(k, batch, tokens):
        if k == start:
            live["pc"] = executor.precopy(dst, batch, steps)
        pc = live.get("pc")
        if start <= k < handoff:
            logits, report = pc.step(batch, tokens)
            on_copy(report)
            problems.extend(f"step {k}: {p}" for p in precopy_problems(model, pc, batch, rank))
            return logits
        if k == handoff:
            logits = (at_handoff(pc, batch, tokens) if at_handoff is not None
                      else executor.step(batch, tokens, dst, "splash", precopy=pc)[0])
            live["pc"] = None
        else:
            logits = model.step(batch, tokens)
        problems.extend(f"step {k}: {p}" for p in accounting_problems(model, batch, rank))
        return logits

    return step
