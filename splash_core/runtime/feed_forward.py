"""The feed-forward part of each block on one rank: a dense MLP or DeepSeek's MoE, each with one
fixed parallelism while attention switches layouts (paper §2): their weights never move.

Both take the normalised hidden state of all rows of the step, the same on every rank (the
model gathers the attention output of every layout to all ranks, as DP-attention engines do),
and return the block's output for all rows, the same on every rank, after one all-reduce:

- :class:`DenseMLP`: tensor parallel, gate/up split by rows of the intermediate width, down by its
  columns (:func:`~splash_core.model.weights.even_shard`).
- :class:`MoE`: the routed experts are **expert parallel**: rank r holds whole experts
  ``even_shard(E, r, T)``, routes every row (the router is replicated and deterministic, so every
  rank picks the same experts) and computes only the pairs routed to its experts; the shared
  experts are tensor parallel like the dense MLP; one all-reduce sums both. Expert parallelism
  over tensor parallelism inside each expert because with every row on every rank both cost the
  same one all-reduce, but EP keeps each expert's matmuls at full width (2048 in DeepSeek-V3, not
  2048/T), reads each active expert's weights on one rank only, and works for any T (experts split
  unevenly where T does not divide them, widths never need to); its cost is load imbalance when
  routing is skewed.
"""

from __future__ import annotations

import torch

from ..model.experts import expert_outputs, route
from ..model.ops import silu_mul as _silu_mul
from ..model.weights import WeightSource, even_shard, layer_prefix, mlp_shapes, moe_tensor_shapes
from ..profiles.model import ModelProfile


def _size(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class DenseMLP:
    """This rank's shard of a SiLU-gated MLP: ``gate_up`` [2 w, d] (gate rows, then up rows) and
    ``down`` [d, w] for its ``w`` columns of the intermediate width; ``silu_mul`` applies the
    activation to the stacked projection (a fused kernel where the backend has one)."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, silu_mul=_silu_mul):
        self.gate_up, self.down, self.silu_mul = gate_up, down, silu_mul

    @classmethod
    def load(cls, source: WeightSource, prefix: str, width: int, d: int, rank: int, T: int,
             device=None, dtype=None, silu_mul=_silu_mul) -> "DenseMLP":
        shapes, cut = mlp_shapes(prefix, width, d), even_shard(width, rank, T)
        rows = slice(cut.start, cut.stop)

        def get(name, **part):
            return source.get(f"{prefix}.{name}", shapes[f"{prefix}.{name}"], **part, device=device, dtype=dtype)

        return cls(torch.cat([get("gate_proj.weight", rows=rows), get("up_proj.weight", rows=rows)]),
                   get("down_proj.weight", cols=rows), silu_mul)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This shard's part of the output (to be summed over ranks)."""
        return self.silu_mul(x @ self.gate_up.t()) @ self.down.t()  # gate_up: [n, 2 w], gate then up

    def forward(self, x: torch.Tensor, collectives) -> torch.Tensor:
        out = self.partial(x)
        collectives.all_reduce(out)
        return out

    def nbytes(self) -> dict[str, int]:
        return {"mlp": _size(self.gate_up) + _size(self.down), "experts": 0}


class MoE:
    """This rank's part of one MoE layer: the whole router, the routed experts ``experts`` (a
    range of expert ids) stacked as ``gate_up`` [G, 2 I, d] and ``down`` [G, d, I], and its shard
    of the shared experts."""

    def __init__(self, profile: ModelProfile, router: torch.Tensor, bias: torch.Tensor | None, experts: range,
                 gate_up: torch.Tensor, down: torch.Tensor, shared: DenseMLP | None, silu_mul=_silu_mul):
        self.config = profile.moe
        self.router, self.bias, self.experts = router, bias, experts
        self.gate_up, self.down, self.shared, self.silu_mul = gate_up, down, shared, silu_mul

    @classmethod
    def load(cls, source: WeightSource, profile: ModelProfile, layer: int, rank: int, T: int,
             device=None, dtype=None, silu_mul=_silu_mul) -> "MoE":
        e, d = profile.moe, profile.hidden_size
        experts = even_shard(e.n_routed_experts, rank, T)
        shapes = moe_tensor_shapes(profile, layer, experts)
        p = f"{layer_prefix(layer)}.mlp"
        width = e.moe_intermediate_size

        def get(name, dtype=dtype):
            return source.get(name, shapes[name], device=device, dtype=dtype)

        # the router in float32 whatever the compute format (as DeepSeek and transformers keep it)
        router = get(f"{p}.gate.weight", torch.float32)
        bias = get(f"{p}.gate.e_score_correction_bias", torch.float32) if e.topk_method == "noaux_tc" else None
        probe = get(f"{p}.experts.{experts.start}.down_proj.weight") if len(experts) else router.to(dtype or torch.float32)
        gate_up = probe.new_empty(len(experts), 2 * width, d)
        down = probe.new_empty(len(experts), d, width)
        for i, j in enumerate(experts):  # filled in place: no second copy of the experts while loading
            gate_up[i, :width] = get(f"{p}.experts.{j}.gate_proj.weight")
            gate_up[i, width:] = get(f"{p}.experts.{j}.up_proj.weight")
            down[i] = probe if i == 0 else get(f"{p}.experts.{j}.down_proj.weight")
        shared = (DenseMLP.load(source, f"{p}.shared_experts", e.n_shared_experts * width, d, rank, T, device, dtype,
                                silu_mul) if e.n_shared_experts else None)
        return cls(profile, router, bias, experts, gate_up, down, shared, silu_mul)

    def forward(self, x: torch.Tensor, collectives) -> torch.Tensor:
        weights, chosen = route(x, self.router, self.bias, self.config)
        out = expert_outputs(x, weights, chosen, self.experts.start, self.gate_up, self.down, self.silu_mul)
        if self.shared is not None:
            out = out + self.shared.partial(x)
        collectives.all_reduce(out)
        return out

    def nbytes(self) -> dict[str, int]:
        """{'experts': the routed experts held here, 'mlp': router and shared-expert shard}."""
        shared = self.shared.nbytes()["mlp"] if self.shared is not None else 0
        return {"experts": _size(self.gate_up) + _size(self.down),
                "mlp": _size(self.router) + _size(self.bias) + shared}


def load_feed_forward(source: WeightSource, profile: ModelProfile, layer: int, rank: int, T: int,
                      device=None, dtype=None, silu_mul=None) -> DenseMLP | MoE | None:
    """Layer ``layer``'s feed-forward part on rank ``rank`` (None: the model has none), its
    activation applied by ``silu_mul`` (None: torch's)."""
    silu_mul = silu_mul or _silu_mul
    if profile.runtime_moe_layer(layer):
        return MoE.load(source, profile, layer, rank, T, device, dtype, silu_mul)
    if not profile.intermediate_size:
        return None
    return DenseMLP.load(source, f"{layer_prefix(layer)}.mlp", profile.intermediate_size, profile.hidden_size,
                         rank, T, device, dtype, silu_mul)
