"""The physical limit of one ``splash run`` (issue 39): the time its steps' matmul FLOPs take at the
device's measured matmul rate and its decode steps' bytes at its measured copy rate, against the
run's measured time.

The engine's summary gives every step's rows and requests, not its contexts, so :func:`schedule`
replays the controller's batch composition (every request admitted at once, in id order; a
decoding request feeds one row; prefilling ones share ``prefill_chunk`` rows in admission order; a
request whose prompt is fed generates a token every step until its ``max_new_tokens``) and checks
it against the run's own rows and requests per step: where they agree (``schedule_matches``) the
contexts are the run's; where not, the first difference is reported and the limit is an estimate.

Per step, at T = 1 and ``layers`` MLA layers:

- FLOPs: every row through every 2-D weight of the layers (Q-A, Q-B, KV-A, O, the MLP; routed
  experts at top-k / experts of their weights) and the LM head for every request of the step;
  attention by the form each request attends in
  (:func:`~splash_core.planning.attention_forms.form_flops`, which also counts kv_b's work);
- bytes (decode steps, one row per request): every weight but the embedding read once (the
  feed-forward ones at one byte and their scales where kept FP8; of the routed experts the share
  B rows touch when each picks top-k of E uniformly, 1 - (1 - k/E)^B) and every request's KV history.

A prefill step (more rows than requests) is FLOP-bound: its floor is its FLOPs at the matmul rate
(those through weights kept FP8 at the FP8 matmul rate where the run measured one: counting them at
the bf16 rate would flatter an FP8 run); a decode step's floor is the longer of its bytes at the copy
rate and its FLOPs at those rates.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from splash_core.model.weights import is_ffn_weight, layer_tensor_shapes
from splash_core.planning.attention_forms import MLADims, expanded_requests, form_flops


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the replayed schedule: each member request's rows and context (rows included)."""

    rows: tuple[int, ...]
    contexts: tuple[int, ...]

    @property
    def decode(self) -> bool:
        return sum(self.rows) == len(self.rows)


def schedule(requests, prefill_chunk: int) -> list[Step]:
    """The steps of serving ``requests`` ((prompt tokens, max new tokens) each) at T = 1."""
    prompt = np.array([p for p, _ in requests], dtype=np.int64)
    wanted = np.array([o for _, o in requests], dtype=np.int64)
    fed, made = np.zeros_like(prompt), np.zeros_like(prompt)
    steps = []
    while (made < wanted).any():
        budget, rows = prefill_chunk, np.zeros_like(prompt)
        for i in np.flatnonzero(made < wanted):
            if fed[i] >= prompt[i]:
                rows[i] = 1
                continue
            take = min(budget, prompt[i] - fed[i]) or (1 if fed[i] else 0)
            budget, rows[i] = max(0, budget - take), take
        members = np.flatnonzero(rows)
        fed[members] += rows[members]
        steps.append(Step(tuple(int(r) for r in rows[members]), tuple(int(c) for c in fed[members])))
        made[members[fed[members] >= prompt[members]]] += 1
    return steps


def schedule_difference(steps: list[Step], step_rows, step_requests) -> str:
    """"" where the replayed ``steps`` have the run's rows and requests at every step, else the first difference."""
    ran = list(zip(step_rows, step_requests))
    if len(ran) != len(steps):
        return f"{len(steps)} steps replayed, {len(ran)} ran"
    for k, (step, (rows, reqs)) in enumerate(zip(steps, ran)):
        if (sum(step.rows), len(step.rows)) != (rows, reqs):
            return f"step {k}: replayed {sum(step.rows)} rows of {len(step.rows)} requests, ran {rows} of {reqs}"
    return ""


@dataclasses.dataclass(frozen=True)
class ModelCosts:
    """What a step's rows cost in FLOPs and bytes, from the model's tensor shapes."""

    row_flops: float  # through the layers' 2-D weights but kv_b (the forms count it)
    head_flops: float  # the LM head, per scored request
    weight_bytes: float  # every weight but the embedding and the routed experts, as held
    expert_bytes: float  # the routed experts, as held
    expert_pick: float  # the share of routed experts one row picks (top-k / E; 0 without experts)
    kv_bytes_per_token: float  # over all layers
    heads_x_layers: int
    dims: MLADims
    fp8_row_flops: float = 0.0  # the part of row_flops through weights kept FP8 (at the FP8 matmul rate)

    @classmethod
    def of(cls, profile, layers: int, elem: int, kv_elem: int, ffn_fp8: bool) -> "ModelCosts":
        params = fp8_params = held = experts = 0.0
        e = profile.moe
        pick = e.num_experts_per_tok / e.n_routed_experts if e is not None else 0.0
        for layer in range(layers):
            for name, shape in layer_tensor_shapes(profile, layer).items():
                numel = float(np.prod(shape))
                ffn = ffn_fp8 and is_ffn_weight(name)
                size = numel + numel / (128 * 128) * 4 if ffn else numel * elem  # FP8 codes + a scale a block
                routed = ".mlp.experts." in name
                experts, held = (experts + size, held) if routed else (experts, held + size)
                if len(shape) == 2 and not name.endswith("kv_b_proj.weight"):
                    used = numel * (pick if routed else 1.0)
                    params += used
                    fp8_params += used if ffn else 0.0
        d, V, m = profile.hidden_size, profile.vocab_size, profile.mla
        return cls(row_flops=2.0 * params, head_flops=2.0 * V * d, weight_bytes=held + (V * d + d) * elem,
                   expert_bytes=experts, expert_pick=pick,
                   kv_bytes_per_token=float((m.kv_lora_rank + m.qk_rope_head_dim) * kv_elem * layers),
                   heads_x_layers=m.heads * layers, dims=MLADims.of(m), fp8_row_flops=2.0 * fp8_params)

    def step_flops(self, step: Step, form: str) -> float:
        rows, contexts = np.array(step.rows), np.array(step.contexts)
        absorbed, expanded = form_flops(self.dims, rows, contexts)
        attention = np.where(expanded_requests(form, self.dims, rows, contexts), expanded, absorbed).sum()
        return float(rows.sum() * self.row_flops + len(rows) * self.head_flops + attention * self.heads_x_layers)

    def step_bytes(self, step: Step) -> float:
        touched = 1.0 - (1.0 - self.expert_pick) ** sum(step.rows)
        return self.weight_bytes + self.expert_bytes * touched + sum(step.contexts) * self.kv_bytes_per_token


def deployment_costs(deployment) -> ModelCosts:
    """What a T = 1 deployment's steps cost: its layers' FLOPs and bytes as its ranks hold them."""
    from splash_core import dtypes

    return ModelCosts.of(deployment.model, deployment.layers or deployment.model.num_layers,
                         dtypes.nbytes(deployment.compute_dtype), dtypes.nbytes(deployment.model.kv_cache.latent_dtype),
                         deployment.ffn_weights == "fp8")


def step_floor(costs: ModelCosts, step: Step, form: str, rates: dict) -> dict:
    """One step's FLOPs, bytes (decode steps; 0 for prefill ones) and floor in seconds: FLOPs at the
    matmul rate, those through weights kept FP8 at the FP8 matmul rate where the run measured one
    (``fp8_matmul_tflops``), for a decode step the longer of that and its bytes at the copy rate."""
    flops = costs.step_flops(step, form)
    fp8 = sum(step.rows) * costs.fp8_row_flops
    moved = costs.step_bytes(step) if step.decode else 0.0
    compute = (flops - fp8) / (rates["matmul_tflops"] * 1e12) + fp8 / (fp8_rate(rates) * 1e12)
    floor = max(moved / (rates["copy_gbps"] * 1e9), compute)
    return {"flops": flops, "fp8_flops": fp8, "bytes": moved, "floor_s": floor}


def fp8_rate(rates: dict) -> float:
    """The rate FP8 GEMMs are held to: the measured FP8 matmul rate, else the matmul rate."""
    return rates.get("fp8_matmul_tflops", rates["matmul_tflops"])


def physical_limit(costs: ModelCosts, steps: list[Step], form: str, rates: dict, step_ms, elapsed_s: float,
                   device_ms=(), ran_decode=None) -> dict:
    """The run's floor (prefill steps FLOP-bound, decode steps the longer of bytes and FLOPs) beside
    its measured time, in all and per part. The measured steps are split by ``ran_decode`` (the run's
    own steps, decode or not; default: ``steps``'), which differs from the replayed ``steps`` where a
    KV pool admitted the run in waves; per part also the steps' device time where ``device_ms`` has
    it (wall time books a host stall inside a step's launch to the step before). ValueError for no
    steps, rates that are not positive or a run time that is not."""
    copy, matmul = rates["copy_gbps"] * 1e9, rates["matmul_tflops"] * 1e12
    if not steps or not (copy > 0 and matmul > 0 and fp8_rate(rates) > 0) or not elapsed_s > 0:
        raise ValueError(f"no physical limit of {len(steps)} steps at {rates} over {elapsed_s} s")
    parts = {p: {"steps": 0, "flops": 0.0, "fp8_flops": 0.0, "bytes": 0.0, "limit_s": 0.0, "measured_s": 0.0,
                 "device_s": None} for p in ("prefill", "decode")}
    for step in steps:
        part, floor = parts["decode" if step.decode else "prefill"], step_floor(costs, step, form, rates)
        part["steps"] += 1
        part["flops"] += floor["flops"]
        part["fp8_flops"] += floor["fp8_flops"]
        part["bytes"] += floor["bytes"]
        part["limit_s"] += floor["floor_s"]
    ran = [s.decode for s in steps] if ran_decode is None else list(ran_decode)
    timed = len(device_ms) == len(ran) and all(ms is not None for ms in device_ms)
    for k, decode in enumerate(ran):
        part = parts["decode" if decode else "prefill"]
        part["measured_s"] += step_ms[k] / 1e3 if k < len(step_ms) else 0.0
        if timed:
            part["device_s"] = (part["device_s"] or 0.0) + device_ms[k] / 1e3
    for part in parts.values():
        part["ratio"] = part["limit_s"] / part["measured_s"] if part["measured_s"] > 0 else None
        part["device_ratio"] = part["limit_s"] / part["device_s"] if part["device_s"] else None
    limit = sum(p["limit_s"] for p in parts.values())
    return {"physical_limit_s": limit, "measured_s": elapsed_s, "ratio": limit / elapsed_s, "parts": parts}


def beside_floors(rows: list[dict], summary: dict, costs: ModelCosts, requests, prefill_chunk: int, form: str,
                  rates: dict) -> dict:
    """``rows`` (one sample per step of a run, in order, each with ``step_ms``) each given its floor
    (``roofline_ms``) and ``over_roofline`` (step time / floor); returns whether the replayed
    schedule is the run's and the medians of the full-batch decode steps' and prefill steps' floors."""
    steps = schedule(requests, prefill_chunk)
    differs = schedule_difference(steps, summary["step_rows"], summary["step_requests"])
    for row, step in zip(rows, steps):
        floor = step_floor(costs, step, form, rates)
        row.update(roofline_ms=floor["floor_s"] * 1e3, over_roofline=row["step_ms"] / (floor["floor_s"] * 1e3),
                   flops=floor["flops"], bytes=floor["bytes"])
    decode = [r["roofline_ms"] for r in rows if r.get("full_batch") and "roofline_ms" in r]
    prefill = [r["roofline_ms"] for r in rows if r["phase"] == "prefill" and "roofline_ms" in r]
    return {"schedule_matches": not differs, "schedule_difference": differs,
            "decode_roofline_ms_p50": float(np.median(decode)) if decode else 0.0,
            "prefill_roofline_ms_p50": float(np.median(prefill)) if prefill else 0.0}
