"""Where a non-finite value (NaN or ±inf) first appears: in the weights, or in a forward pass.

A checkpoint with one NaN weight makes every logit NaN, and comparisons with NaN are false, so
a check must look for them explicitly and say where they came from: the first weight tensor
holding one (its checkpoint name, so the layer and tensor), else the first sub-step of the
reference's forward pass (embedding, a layer's attention, MoE or MLP) whose output went
non-finite, or so large that its square overflows (RMSNorm squares the stream: past that the
next norm returns zeros and the logits collapse to one constant, which no comparison with a
tolerance catches).
"""

from __future__ import annotations

from typing import Mapping

import torch

from .reference_model import ReferenceModel


def kind(t: torch.Tensor) -> str:
    """Which non-finite values ``t`` holds ("NaN", "inf", "NaN and inf"; "" when all are finite)."""
    nan, inf = bool(torch.isnan(t).any()), bool(torch.isinf(t).any())
    return " and ".join(word for word, there in (("NaN", nan), ("inf", inf)) if there)


def first_nonfinite_weight(weights: Mapping[str, torch.Tensor]) -> str:
    """"weight NAME holds NaN" for the first tensor (in ``weights``' order) with a non-finite
    value; "" when every weight is finite."""
    names = [name for name, t in weights.items() if t.is_floating_point()]
    if not names:
        return ""
    finite = torch.stack([torch.isfinite(weights[name]).all() for name in names]).cpu()  # one wait, not one a tensor
    if bool(finite.all()):
        return ""
    name = names[int(torch.nonzero(~finite)[0])]
    return f"weight {name} holds {kind(weights[name])}"


def overflowing(h: torch.Tensor) -> str:
    """What is wrong with residual rows ``h`` [n, d]: non-finite values, or values whose square
    overflows ``h``'s format; "" when neither."""
    if not bool(torch.isfinite(h).all()):
        return kind(h)
    limit = torch.finfo(h.dtype).max ** 0.5
    return f"values up to {float(h.abs().max()):.3g} (squares overflow past {limit:.3g})" \
        if bool((h.abs() > limit).any()) else ""


def first_nonfinite_step(ref: ReferenceModel, request: int, tokens: torch.Tensor, chunk: int) -> str:
    """Replay ``tokens`` of a fresh ``request`` through ``ref`` in chunks of ``chunk`` rows and
    name the first position and sub-step whose residual stream went non-finite or overflowing
    (:func:`overflowing`), or the final norm and LM head when only the logits did ("" when
    nothing did)."""
    found: list[str] = []

    def watch(step: str, h: torch.Tensor) -> None:
        wrong = "" if found else overflowing(h)
        if wrong:
            bad = ~torch.isfinite(h).all(dim=-1) | (h.abs() > torch.finfo(h.dtype).max ** 0.5).any(dim=-1)
            found.append(f"{step} output holds {wrong} (from position {start + int(torch.nonzero(bad)[0])})")

    try:
        for start in range(0, tokens.numel(), chunk):
            h = ref.forward(request, start, tokens[start: start + chunk], watch)
            logits = ref.logits(h)
            wrong = "" if found else kind(logits) or ("constant" if bool(constant_rows(logits).any()) else "")
            if wrong:
                found.append(f"the final norm and LM head (logits {wrong})")
            if found:
                break
    finally:
        ref.release(request)
    return found[0] if found else ""



def constant_rows(logits: torch.Tensor) -> torch.Tensor:
    """Bool [n]: rows of ``logits`` [n, V] whose values are all equal (a collapsed stream: every
    token ties, so every token would pass a comparison)."""
    return logits.amax(dim=-1) == logits.amin(dim=-1)
