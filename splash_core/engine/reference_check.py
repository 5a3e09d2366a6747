"""Outputs against the single-device reference (:class:`~splash_core.runtime.reference_model.ReferenceModel`).

Every checked request is replayed through the reference with the engine's own tokens fed
back (teacher forcing): its prompt, then its generated tokens but the last. At every position
that produced an output, the reference's greedy token must equal the engine's. By induction
this is the same as generating greedily with the reference from the same prompt for the same
number of tokens, and it scores a whole request in a few chunked passes instead of one step
per token, so it is cheap enough for long requests on an accelerator.

In float32 (compute and KV cache) the check is exact (layouts differ from the reference only in
reduction order). In a lower-precision format the reference runs in float32 on the same rounded weights, and
a differing token passes when the reference itself nearly ties there: its top logit exceeds
the engine token's by at most ``tolerance`` x the largest |logit| of that row.

A KV cache stored below float32 (fp8, bf16, fp16) rounds every latent and rotary key the pool
keeps; the reference rounds its history to the same format (:class:`ReferenceModel`'s
``kv_dtype``), so both attend over the same stored values. What can still differ is a value
that lands on the other side of a rounding boundary because a layout summed in another order:
it moves by one unit in the last place of the KV format. The tolerance is therefore at least
that format's unit roundoff (fp8 e4m3 1/16, bf16 1/256, fp16 1/2048): a token may differ only
where the reference's top logits tie that closely. (Without the rounding the reference attends
over float32 keys, every layout differs from it by the fp8 error, and uniform fp8 failed.)

The reference expands every head's keys and values and scores every pair, so its cost grows
with the square of a request's length: requests are checked cheapest first while the estimated
work stays within ``flop_budget`` (at least one; all of them for the tiny CPU model), and the
result says how many were checked.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
import torch

from ..checkpoint.source import weight_source
from ..dtypes import torch_dtype
from ..model.weights import RoundedWeights
from ..runtime.reference_model import ReferenceModel
from ..runtime.sampling import GREEDY, SamplingParams, choose_rows, in_kept
from .draws import uniforms

DEFAULT_TOLERANCE = 0.05  # for formats below float32 (bf16 accumulates ~1% logit error over 4 layers)
DEFAULT_FLOP_BUDGET = 2e14  # about 5 s of float32 work on an H200; far above what the CPU jobs need


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The verdict and the evidence."""

    passed: bool  # False when nothing was compared
    requests: int  # requests checked
    of: int  # requests that could be checked (finished ones); the cheapest were checked first
    tokens: int  # generated tokens compared
    mismatches: int  # tokens where the engine's differs from the reference's greedy token
    decisive: int  # mismatches outside the tolerance (0 when passed)
    exact: bool  # float32: every token had to match
    tolerance: float
    first_failure: str = ""  # request, position and logits of the first decisive mismatch

    def line(self) -> str:
        if not self.requests:
            return "nothing to compare: no request finished with generated tokens"
        if self.passed:
            how = "equal" if not self.mismatches else f"equal within tolerance ({self.mismatches} near-ties)"
            which = f"{self.requests}" if self.requests == self.of else f"the {self.requests} cheapest of {self.of}"
            return f"outputs {how} to the single-device reference ({which} requests, {self.tokens} tokens)"
        return f"outputs DIFFER from the single-device reference: {self.decisive} of {self.tokens} tokens; {self.first_failure}"


class _Scorer(ReferenceModel):
    """The reference, giving the logits of every row of a request (not only the last)."""

    def score(self, request: int, tokens: torch.Tensor, chunk: int, first: int = 0) -> torch.Tensor:
        """Logits [n - first, V] float32 of positions ``first``.. of ``tokens`` fed from position 0."""
        out = []
        for start in range(0, tokens.numel(), chunk):
            h = self.forward(request, start, tokens[start: start + chunk])
            out.append(self.logits(h[max(0, first - start):]))  # rows before ``first`` predict nothing we check
        self.release(request)
        return torch.cat(out)


def reference_flops(profile, layers: int, tokens: int, chunk: int) -> float:
    """Estimated work of scoring one request of ``tokens`` tokens with :class:`_Scorer`: every
    chunk scores all pairs against the whole history and re-expands it per head."""
    m = profile.mla
    pairs = tokens * tokens / 2 + tokens * chunk / 2
    expand = (tokens / chunk + 1) * tokens / 2 * m.heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank
    attend = pairs * m.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    moe = profile.moe if profile.runtime_experts else None
    width = (moe.moe_intermediate_size * (moe.n_routed_experts + moe.n_shared_experts)  # every expert, every row
             if moe is not None else profile.intermediate_size or 0)
    return 2.0 * layers * (expand + attend + tokens * 3 * profile.hidden_size * width)


def kv_tolerance(kv_dtype: torch.dtype) -> float:
    """The near-tie a KV format admits: its unit roundoff (0 for float32; see the module docstring)."""
    if not kv_dtype.is_floating_point:
        raise ValueError(f"the reference check compares floating-point KV formats only (got {kv_dtype})")
    return 0.0 if kv_dtype == torch.float32 else torch.finfo(kv_dtype).eps / 2


def check(deployment, prompts: Mapping[int, np.ndarray], outputs: Mapping[int, Sequence[int]], device="cpu", *,
          tolerance: float | None = None, chunk: int = 512, flop_budget: float = DEFAULT_FLOP_BUDGET,
          sampling: Mapping[int, SamplingParams] | None = None) -> CheckResult:
    """Compare the engine's ``outputs`` (request id -> generated tokens) of the given ``prompts``
    with the reference on ``device``, cheapest requests first within ``flop_budget``; ``tolerance``
    overrides the one the compute and KV formats give. A request with ``sampling`` parameters
    (default greedy) is compared with the reference's choice from the same uniform draws."""
    compute, kv = torch_dtype(deployment.compute_dtype), torch_dtype(deployment.model.kv_cache.latent_dtype)
    low_compute = compute != torch.float32
    exact = not low_compute and kv == torch.float32
    tol = 0.0 if exact else (max(DEFAULT_TOLERANCE if low_compute else 0.0, kv_tolerance(kv))
                             if tolerance is None else tolerance)
    source = weight_source(deployment.model, deployment.seed)
    if low_compute:
        source = RoundedWeights(source, compute)
    ref = _Scorer(deployment.model, source, device, torch.float32, deployment.layers,
                  kv_dtype=None if kv == torch.float32 else kv)
    layers = deployment.layers or deployment.model.num_layers
    cost = {rid: reference_flops(deployment.model, layers, len(prompts[rid]) + len(out), chunk)
            for rid, out in outputs.items() if len(out)}
    chosen, spent = [], 0.0
    for rid in sorted(cost, key=cost.get):
        if chosen and spent + cost[rid] > flop_budget:
            break
        chosen.append(rid)
        spent += cost[rid]
    tokens = mismatches = decisive = 0
    first = ""
    for rid in chosen:
        prompt, generated = np.asarray(prompts[rid], dtype=np.int64), outputs[rid]
        fed = torch.as_tensor(np.concatenate([prompt, np.asarray(generated[:-1], dtype=np.int64)]), device=device)
        logits = ref.score(rid, fed, chunk, first=len(prompt) - 1)
        engine = torch.as_tensor(np.asarray(generated, dtype=np.int64), device=device)
        params = (sampling or {}).get(rid, GREEDY)
        if params.greedy:
            top = logits.max(dim=-1)
            differ = logits.argmax(dim=-1) != engine
            gap = top.values - logits.gather(1, engine[:, None])[:, 0]
            bad = differ & (gap > tol * logits.abs().max(dim=-1).values)
        else:
            differ, bad, gap = _sampled(logits, engine, params, rid, exact)
        tokens += len(generated)
        mismatches += int(differ.sum())
        decisive += int(bad.sum())
        if bad.any() and not first:
            k = int(torch.nonzero(bad)[0])
            first = (f"request {rid}, output {k}: engine token {int(engine[k])}, reference {int(logits[k].argmax())} "
                     f"(logit gap {float(gap[k]):.4g})" if params.greedy else
                     f"request {rid}, output {k}: engine sampled {int(engine[k])}, outside the reference's kept tokens")
    return CheckResult(decisive == 0 and bool(chosen), len(chosen), len(cost), tokens, mismatches, decisive, exact,
                       tol, first)


def _sampled(logits: torch.Tensor, engine: torch.Tensor, params: SamplingParams, rid: int, exact: bool):
    """(differ, decisive, gap) of a sampled request: the reference's choice from the same draws
    must be the engine's; in a lower precision a differing token counts only when the reference
    would never have kept it (outside its top-k / top-p set)."""
    rows = [params] * len(engine)
    ref = choose_rows(logits, rows, uniforms(rows, [rid] * len(rows), range(len(rows)))).to(engine.device)
    differ = ref != engine
    decisive = differ.clone()
    if not exact and differ.any():  # only a differing token needs the kept set's verdict
        at = torch.nonzero(differ)[:, 0]
        decisive[at] = ~in_kept(logits[at], [params] * len(at), engine[at]).to(engine.device)
    return differ, decisive, torch.zeros(len(engine), device=engine.device)
