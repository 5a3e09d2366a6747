"""Outputs against the single-device reference (:class:`~splash_core.runtime.reference_model.ReferenceModel`).

Every checked request is replayed through the reference with the engine's own tokens fed
back (teacher forcing): its prompt, then its generated tokens but the last. At every position
that produced an output, the reference's greedy token must equal the engine's. By induction
this is the same as generating greedily with the reference from the same prompt for the same
number of tokens, and it scores a whole request in a few chunked passes instead of one step
per token, so it is cheap enough for long requests on an accelerator.

A check that cannot fail is worthless, so these fail it whatever the tokens: a non-finite weight
(NaN or inf: the line names the first such tensor by its checkpoint name); reference logits that
are non-finite or all equal at a compared position (a collapsed stream, where every token ties:
the line names the first sub-step whose output went non-finite or so large that the next
RMSNorm's squares overflow, :mod:`~splash_core.runtime.nonfinite`); an engine token outside the
vocabulary; and nothing to compare (no request finished with a generated token: ``passed`` is
False). Every verdict below is written so that a NaN makes it fail (``not gap <= allowed``).

In float32 (compute and KV cache) the check is exact (layouts differ from the reference only in
reduction order): every token must be the reference's greedy one. Where the deployment attends
sparsely (a DSA indexer: :func:`~splash_core.runtime.model_config.attends_sparsely`) the reference
attends over each query's top-k keys too, the model's real function.

Below float32 the engine's logits carry the compute format's rounding error, and where the
reference's top two logits are closer than that error the engine may pick the other one. The
error is measured, not assumed: the reference scores the same fed tokens twice on the same
rounded weights, in float32 and in the compute format (the latter sending every row to the
experts the float32 run chose), and ``e`` = that row's largest |compute-format logit - float32
logit|. A differing token passes only when the float32 reference's gap between its top token and
the engine's is at most ``ERROR_MULTIPLE`` x ``e`` (+ the KV part below). Why 4: a flip needs the
two logits' errors to close the gap, so up to 2 ``e`` if the engine's error were the reference's;
the engine rounds in another order (other kernels, layouts that sum partial results across
ranks), so its error is the same size but not the same at each row, and a factor 2 covers that.
Measured on 27 bf16 engine runs of transformers-written checkpoints (3 prompts each; seeds 0-2
in TP, 3-5 in CP and DOP; 1,152 rows): ``e`` had median 0.024 and max 0.054 (max |logit| about 4); the tokens that
differed by rounding had gaps up to 0.9 ``e``; a wrong token's gap is O(max |logit|) (planted
ones: 0.3 to 4.7), far outside. (A fixed 0.05 x max |logit| failed 5 of those 27 correct runs.)

Routing is discrete: where a MoE layer's router nearly ties (its k-th and (k+1)-th expert, or its
last kept and first dropped group), a run in the compute format may route that row the other
way, moving its logits by O(1) (seen: 0.2 to 2.7), and through the KV history the logits of the
rows after it, which no multiple of ``e`` should cover. So a differing token outside the
allowance gets more chances: the request is re-scored in float32 with one near-tie decision taken
the other way (:mod:`~splash_core.runtime.routing_ties`): one at the row's position or before, in
any MoE layer, whose margin is within ``ROUTE_MULTIPLE`` (8) x the measured error of that layer's
router scores there; the token passes if it is within the allowance in one of them. (8, not 4:
an engine layout's router scores stray further from float32 than the reference's compute-format
run; the TP engine flipped a decision whose margin was 6.2 such errors.) The row's own position's
near-ties are tried first, then the others closest first, at most ``ROW_RESCORES`` re-scores for
a row and ``MAX_RESCORES`` for a request. The 5 runs above that the fixed rule failed are the 5
that need this (each its own row's decision); on the CPU main job's checkpoint (MoE in 3 of 4
layers) decisions up to 11 positions before the row were needed. With it, 51 correct bf16 runs
(the 27 above and 24 of that checkpoint: 6 prompts x 4 layouts, 64 tokens) pass, and every
planted wrong token fails (336 shifted ids; 91 runner-up tokens where the float32 top two differ
by more than 0.5).

A KV cache stored below float32 (fp8, bf16, fp16) rounds every latent and rotary key the pool
keeps; the reference rounds its history to the same format (:class:`ReferenceModel`'s
``kv_dtype``), so both attend over the same stored values. What can still differ is a value
that lands on the other side of a rounding boundary because a layout summed in another order:
it moves by one unit in the last place of the KV format. The allowed gap therefore adds that
format's unit roundoff (fp8 e4m3 1/16, bf16 1/256, fp16 1/2048) x the row's largest |logit|: a
token may differ only where the reference's top logits tie that closely. (Without the rounding
the reference attends over float32 keys, every layout differs from it by the fp8 error, and
uniform fp8 failed.)

A sampled request must draw the reference's token from the same uniform draws; below float32 a
differing token counts only when the reference would never have kept it (outside its top-k /
top-p / min-p set). Penalties and ``min_tokens`` adjust both references' logits from the
request's tokens so far (:func:`~splash_core.runtime.sampling.adjust_logits`), as the engine does.

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
from ..runtime.model_config import attends_sparsely
from ..runtime.nonfinite import constant_rows, first_nonfinite_step, first_nonfinite_weight
from ..runtime.reference_scorer import HeldWeights, Scorer
from ..runtime.sampling import GREEDY, History, SamplingParams, adjust_logits, choose_rows, in_kept
from .draws import uniforms

ERROR_MULTIPLE = 4.0  # 2 (two logits' errors) x 2 (the engine's error is not the reference's): the docstring
DEFAULT_FLOP_BUDGET = 2e14  # about 5 s of float32 work on an H200; far above what the CPU jobs need
HISTORY_ROWS = 256  # rows of a penalised request adjusted at once (each holds a [V] count of its tokens)
ROUTE_MULTIPLE = 8.0  # a routing decision is a near-tie within this many router-score errors (docstring)
ROW_RESCORES, MAX_RESCORES = 16, 48  # re-scores with one routing near-tie taken the other way: a row's, a request's


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The verdict and the evidence."""

    passed: bool  # False when nothing was compared or anything was non-finite
    requests: int  # requests checked
    of: int  # requests that could be checked (finished ones); the cheapest were checked first
    tokens: int  # generated tokens compared
    mismatches: int  # tokens where the engine's differs from the reference's greedy token
    decisive: int  # mismatches outside the allowed gap, and tokens with non-finite reference logits
    exact: bool  # float32: every token had to match
    tolerance: float  # allowed gap's share of the row's largest |logit| (the KV format's unit roundoff)
    first_failure: str = ""  # request, position and logits of the first decisive mismatch
    compute_error: float = 0.0  # largest measured |compute-format - float32| reference logit error of a row
    error_multiple: float = 0.0  # a differing token passes within this many of its row's error (0: none)
    routing_flips: int = 0  # mismatches that passed with a near-tie routing decision taken the other way
    nonfinite: str = ""  # where a NaN / inf (or an overflow) first appeared: weight or forward sub-step

    def line(self) -> str:
        if not self.requests:
            why = "nothing to compare: no request finished with generated tokens"
            return why + (f" (and the reference's {self.nonfinite})" if self.nonfinite else "")
        if self.nonfinite:
            return (f"non-finite or overflowing values in the reference: {self.nonfinite}; "
                    f"{self.decisive} of {self.tokens} tokens fail"
                    + (f"; {self.first_failure}" if self.first_failure else ""))
        if self.passed:
            flips = f", {self.routing_flips} of them routing near-ties" if self.routing_flips else ""
            how = "equal" if not self.mismatches else f"equal within tolerance ({self.mismatches} near-ties{flips})"
            which = f"{self.requests}" if self.requests == self.of else f"the {self.requests} cheapest of {self.of}"
            error = (f"; compute-format logit error up to {self.compute_error:.3g}, gaps within "
                     f"{self.error_multiple:g}x allowed" if self.error_multiple else "")
            return f"outputs {how} to the single-device reference ({which} requests, {self.tokens} tokens{error})"
        return (f"outputs DIFFER from the single-device reference: {self.decisive} of {self.tokens} tokens; "
                f"{self.first_failure}")


@dataclasses.dataclass(frozen=True)
class _Rule:
    """When a differing token is decisive: its float32 gap exceeds ``relative`` x the row's largest
    |logit| + ``multiple`` x the row's error measured by ``low`` (the compute-format reference;
    None: not measured). ``exact``: both are 0, only an exact tie passes."""

    exact: bool
    relative: float
    multiple: float
    low: Scorer | None


def reference_flops(profile, layers: int, tokens: int, chunk: int) -> float:
    """Estimated work of scoring one request of ``tokens`` tokens with :class:`Scorer`: every
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
    with the reference on ``device``, cheapest requests first within ``flop_budget``. ``tolerance``
    replaces the measured rule below float32 by a fixed share of each row's largest |logit|. A
    request with ``sampling`` parameters (default greedy) is compared with the reference's choice
    from the same uniform draws."""
    compute, kv = torch_dtype(deployment.compute_dtype), torch_dtype(deployment.model.kv_cache.latent_dtype)
    low_compute = compute != torch.float32
    exact = not low_compute and kv == torch.float32
    source = weight_source(deployment.model, deployment.seed, deployment.keeps_fp8)
    if low_compute:
        source = RoundedWeights(source, compute)
    kv_format = None if kv == torch.float32 else kv
    sparse = attends_sparsely(deployment)  # the function the engine's layers compute
    ref = Scorer(deployment.model, source, device, torch.float32, deployment.layers, kv_dtype=kv_format, sparse=sparse)
    measured = low_compute and tolerance is None
    low = (Scorer(deployment.model, HeldWeights(ref.w), device, compute, deployment.layers, kv_dtype=kv_format,
                  sparse=sparse) if measured else None)  # the same rounded weights, computing in the compute format
    rule = _Rule(exact, 0.0 if exact else kv_tolerance(kv) if tolerance is None else tolerance,
                 ERROR_MULTIPLE if measured else 0.0, low)
    chosen, of = _cheapest(deployment, prompts, outputs, chunk, flop_budget)
    tally = _Tally()
    for rid in chosen:
        tally.add(rid, *_compare(ref, rule, rid, prompts[rid], outputs[rid], (sampling or {}).get(rid, GREEDY), chunk))
    where = first_nonfinite_weight(ref.w)
    if not where and tally.nonfinite_request is not None:  # finite weights: find the sub-step
        rid = tally.nonfinite_request
        step = first_nonfinite_step(ref, rid, _fed(prompts[rid], outputs[rid], device), chunk)
        where = f"request {rid}: {step or tally.nonfinite_at}"
    return CheckResult(tally.decisive == 0 and bool(chosen) and not where, len(chosen), of, tally.tokens,
                       tally.mismatches, tally.decisive, exact, rule.relative, tally.first, tally.error,
                       rule.multiple, tally.flips, where)


def _cheapest(deployment, prompts, outputs, chunk: int, flop_budget: float) -> tuple[list[int], int]:
    """(The requests to check, cheapest first within ``flop_budget`` but at least one; how many
    could be checked: those with a generated token)."""
    layers = deployment.layers or deployment.model.num_layers
    cost = {rid: reference_flops(deployment.model, layers, len(prompts[rid]) + len(out), chunk)
            for rid, out in outputs.items() if len(out)}
    chosen, spent = [], 0.0
    for rid in sorted(cost, key=cost.get):
        if chosen and spent + cost[rid] > flop_budget:
            break
        chosen.append(rid)
        spent += cost[rid]
    return chosen, len(cost)


def _fed(prompt, generated, device) -> torch.Tensor:
    """What the reference is fed: the prompt, then the generated tokens but the last."""
    return torch.as_tensor(np.concatenate([np.asarray(prompt, dtype=np.int64),
                                           np.asarray(generated[:-1], dtype=np.int64)]), device=device)


class _Tally:
    """The counts over the checked requests, and the first failure's evidence."""

    def __init__(self):
        self.tokens = self.mismatches = self.decisive = self.flips = 0
        self.error, self.first, self.nonfinite_at = 0.0, "", ""
        self.nonfinite_request: int | None = None

    def add(self, rid: int, tokens: int, mismatches: int, decisive: int, flips: int, error: float, first: str,
            nonfinite: str) -> None:
        self.flips += flips
        self.tokens += tokens
        self.mismatches += mismatches
        self.decisive += decisive
        self.error = error if not error <= self.error else self.error  # a NaN error is kept, not dropped
        self.first = self.first or first
        if nonfinite and self.nonfinite_request is None:
            self.nonfinite_at, self.nonfinite_request = nonfinite, rid


def _compare(ref: Scorer, rule: _Rule, rid: int, prompt, generated, params: SamplingParams, chunk: int):
    """(tokens, mismatches, decisive, routing flips, largest row error, first failure, non-finite
    note) of one request."""
    prompt = np.asarray(prompt, dtype=np.int64)
    if not len(prompt):
        n = len(generated)
        return n, n, n, 0, 0.0, f"request {rid}: an empty prompt (nothing for the reference to continue)", ""
    fed, first = _fed(prompt, generated, ref.w["lm_head.weight"].device), len(prompt) - 1
    measured = rule.low is not None and params.greedy  # a sampled token's verdict is its kept set's
    routed = measured and ref.profile.moe is not None
    raw = ref.score(rid, fed, chunk, first, record=routed)
    engine = torch.as_tensor(np.asarray(generated, dtype=np.int64), device=raw.device)
    vocab = raw.shape[-1]
    outside = (engine < 0) | (engine >= vocab)  # a token id the model has not: decisive, never indexed
    engine_ids = engine.clamp(0, vocab - 1)
    adjust = _adjuster(prompt, generated, params, vocab)
    logits = adjust(raw)
    error = torch.zeros(len(engine), device=raw.device)
    if measured:  # routed as the float32 run was: the continuous error alone (flips are re-scored below)
        follow = {layer: experts for layer, (_, experts) in ref.recorded().items()} if routed else None
        low = adjust(rule.low.score(rid, fed, chunk, first, record=routed, follow=follow))
        error = torch.where(low == logits, 0.0, (low - logits).abs()).amax(dim=-1)  # equal -inf (masked) is no error
    allowed = rule.relative * logits.abs().amax(dim=-1) + rule.multiple * error
    nonfinite = ~torch.isfinite(raw).all(dim=-1) | constant_rows(raw)  # a NaN or a collapse: nothing to compare
    flips = 0
    if params.greedy:
        differ, gap = logits.argmax(dim=-1) != engine_ids, _gap(logits, engine_ids)
        bad = differ & ~(gap <= allowed)  # written so that a NaN gap is decisive
        if routed and bad.any():
            rescued = _flipped_routing(ref, rule, rid, fed, first, bad, engine_ids, allowed, adjust, chunk)
            bad, flips = bad & ~rescued, int(rescued.sum())
    else:
        usable = logits.masked_fill(nonfinite[:, None], 0.0)  # those rows fail anyway; a NaN would break the draw
        differ, bad, gap = _sampled(usable, engine_ids, params, rid, rule.exact)
    differ, bad = differ | outside, bad | outside | nonfinite
    failure = _first_failure(rid, bad, nonfinite, outside, engine, logits, gap, error, params)
    note = f"logits non-finite or constant at {int(nonfinite.sum())} of {len(engine)} rows" if nonfinite.any() else ""
    return (len(generated), int(differ.sum()), int(bad.sum()), flips,
            float(error.max()) if len(error) else 0.0, failure, note)


def _gap(logits: torch.Tensor, engine: torch.Tensor) -> torch.Tensor:
    """Per row: the top logit minus the engine token's."""
    return logits.max(dim=-1).values - logits.gather(1, engine[:, None])[:, 0]


def _flipped_routing(ref: Scorer, rule: _Rule, rid: int, fed, first: int, bad, engine, allowed, adjust,
                     chunk: int) -> torch.Tensor:
    """Bool [n]: the decisive rows whose token is within ``allowed`` in a float32 re-score with one
    near-tie routing decision taken the other way, as a run in the compute format may take it: a
    decision at the row's position or before (its effect reaches later rows through the KV
    history), in any MoE layer, whose margin is within ``ROUTE_MULTIPLE`` x the measured
    compute-format error of that layer's router scores there. Row by row, the row's own position's
    near-ties first, then the others closest first: at most ``ROW_RESCORES`` re-scores for a row
    and ``MAX_RESCORES`` for the request; each re-score may rescue any row."""
    near = _near_ties(ref, rule.low, ROUTE_MULTIPLE)
    rescued, tried = torch.zeros_like(bad), set()
    for row in torch.nonzero(bad)[:, 0].tolist():
        at = first + row
        options = sorted((pos != at, ratio, layer, pos) for ratio, layer, pos in near
                         if pos <= at and (layer, pos) not in tried)
        for _, _, layer, pos in options[:ROW_RESCORES]:
            if rescued[row] or len(tried) >= MAX_RESCORES:
                break
            tried.add((layer, pos))
            other = adjust(ref.score(rid, fed, chunk, first, flip=(layer, pos)))
            rescued |= bad & (_gap(other, engine) <= allowed)
    return rescued


def _near_ties(ref: Scorer, low: Scorer, multiple: float) -> list[tuple[float, int, int]]:
    """(margin / error, MoE layer, position) of every routing decision of the last recorded scores
    whose margin is within ``multiple`` x the measured error of its router scores (``ref``'s
    against ``low``'s)."""
    mine = {layer: scores for layer, (scores, _) in ref.recorded().items()}
    theirs = {layer: scores for layer, (scores, _) in low.recorded().items()}
    out = []
    for layer, margin in ref.margins(mine).items():
        ratio = margin / (theirs[layer] - mine[layer]).abs().amax(dim=-1).clamp_min(1e-30)
        out += [(float(ratio[p]), layer, int(p)) for p in torch.nonzero(ratio <= multiple)[:, 0].tolist()]
    return out


def _first_failure(rid, bad, nonfinite, outside, engine, logits, gap, error, params) -> str:
    if not bad.any():
        return ""
    k = int(torch.nonzero(bad)[0])
    where = f"request {rid}, output {k}: "
    if nonfinite[k]:
        return where + "the reference's logits are not finite, or all equal"
    if outside[k]:
        return where + f"engine token {int(engine[k])} outside the vocabulary of {logits.shape[-1]}"
    if not params.greedy:
        return where + f"engine sampled {int(engine[k])}, outside the reference's kept tokens"
    measured = f", measured error {float(error[k]):.4g}" if float(error[k]) else ""
    return where + (f"engine token {int(engine[k])}, reference {int(logits[k].argmax())} "
                    f"(logit gap {float(gap[k]):.4g}{measured})")


def _adjuster(prompt: np.ndarray, generated: Sequence[int], params: SamplingParams, vocab: int):
    """The function adjusting a request's [n, V] logits as the engine did before choosing each
    token (penalties and ``min_tokens`` from its tokens so far); the identity when nothing does."""
    if not params.needs_history:
        return lambda logits: logits
    tokens = [int(t) for t in generated]

    def adjust(logits: torch.Tensor) -> torch.Tensor:
        parts = []
        for lo in range(0, len(tokens), HISTORY_ROWS):
            rows = range(lo, min(lo + HISTORY_ROWS, len(tokens)))
            history = History.of([prompt] * len(rows), [tokens[:k] for k in rows], vocab, logits.device)
            parts.append(adjust_logits(logits[lo: rows.stop], [params] * len(rows), history))
        return torch.cat(parts)

    return adjust


def _sampled(logits: torch.Tensor, engine: torch.Tensor, params: SamplingParams, rid: int, exact: bool):
    """(differ, decisive, gap) of a sampled request: the reference's choice from the same draws
    must be the engine's; in a lower precision a differing token counts only when the reference
    would never have kept it (outside its top-k / top-p / min-p set)."""
    rows = [params] * len(engine)
    ref = choose_rows(logits, rows, uniforms(rows, [rid] * len(rows), range(len(rows)))).to(engine.device)
    differ = ref != engine
    decisive = differ.clone()
    if not exact and differ.any():  # only a differing token needs the kept set's verdict
        at = torch.nonzero(differ)[:, 0]
        decisive[at] = ~in_kept(logits[at], [params] * len(at), engine[at]).to(engine.device)
    return differ, decisive, torch.zeros(len(engine), device=engine.device)
