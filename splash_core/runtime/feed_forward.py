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
  routing is skewed. A large step (a prefill chunk) builds only the pairs routed to this rank's
  experts; a small one builds every pair and drops the others' (no read back to the host, the
  shapes a captured decode graph replays).

  With ``shared_whole`` every rank holds the shared experts whole and computes them for its share
  of the rows, and :meth:`MoE.forward_owned` takes only an owner's rows: they travel by all-to-all
  to their experts' ranks and their sums come back (:mod:`~splash_core.planning.moe_dispatch` says
  in which steps).

With ``fp8`` (:attr:`~splash_core.runtime.model_config.ModelConfig.fp8_ffn`) both keep the weights of
an FP8 block-scaled checkpoint as stored (:class:`~splash_core.model.fp8_blocks.StackedFP8`: e4m3
codes and the 128 x 128 scale blocks of this rank's slices, TP shards starting mid-block; gate and up
rows joined into one weight where they meet on a block boundary), so a rank holds about the bytes it
read, and dequantize them at each use into the tensor a dequantize-at-load
model holds: the outputs are that model's, bit for bit. Given a backend's
:class:`~splash_core.platform.interfaces.FP8LinearKernels`, they instead multiply the FP8 weights
directly (W8A8: activations quantized per token group), within the tolerance-aware check.
"""

from __future__ import annotations

from functools import partial
from itertools import chain

import torch

from ..model.experts import expert_outputs, route
from ..model.fp8_blocks import StackedFP8, stack_experts, stacked_rows
from ..model.ops import silu_mul as _silu_mul
from ..model.weights import WeightSource, even_shard, layer_prefix, mlp_shapes, moe_tensor_shapes
from ..platform.interfaces import FP8LinearKernels
from ..profiles.model import ModelProfile
from .expert_exchange import dispatch_and_combine

# Routed pairs from which a step builds only its own experts' (one read of their count to the host):
# below it the pairs of all ranks cost little, and a decode step keeps its queue of launches.
OWN_PAIRS_FROM = 4096


def _size(t: torch.Tensor | StackedFP8 | None) -> int:
    if isinstance(t, StackedFP8):
        return t.stored_bytes
    return 0 if t is None else t.numel() * t.element_size()


def _dense(w: torch.Tensor | StackedFP8) -> torch.Tensor:
    """The weight to compute with: a weight kept FP8 is dequantized for this use only."""
    return w.dequantize() if isinstance(w, StackedFP8) else w


def _by_parts(op, x: torch.Tensor, w: StackedFP8, *args) -> torch.Tensor:
    """``x`` through each part of ``w`` by the FP8 kernel ``op``, the outputs side by side (gate, then up)."""
    outs = [op(x, part, *args) for part in w.parts]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def _fp8_source(source: WeightSource):
    """``source`` if it hands out FP8 weights as stored; else ValueError (FFN weights kept FP8 need one)."""
    if not callable(getattr(source, "get_block_scaled", None)):
        raise ValueError(f"FFN weights kept FP8 need an FP8 block-scaled checkpoint; the weights come from "
                         f"{type(source).__name__}")
    return source


class DenseMLP:
    """This rank's shard of a SiLU-gated MLP: ``gate_up`` [2 w, d] (gate rows, then up rows) and
    ``down`` [d, w] for its ``w`` columns of the intermediate width (tensors, or kept FP8);
    ``silu_mul`` applies the activation to the stacked projection (a fused kernel where the backend
    has one); ``fp8_kernels`` multiply weights kept FP8 without dequantizing them (None: dequantized
    at each use)."""

    def __init__(self, gate_up: torch.Tensor | StackedFP8, down: torch.Tensor | StackedFP8, silu_mul=_silu_mul,
                 fp8_kernels: FP8LinearKernels | None = None):
        self.gate_up, self.down, self.silu_mul = gate_up, down, silu_mul
        self.kernels = fp8_kernels if isinstance(gate_up, StackedFP8) else None

    @classmethod
    def load(cls, source: WeightSource, prefix: str, width: int, d: int, rank: int, T: int,
             device=None, dtype=None, silu_mul=_silu_mul, fp8: bool = False,
             fp8_kernels: FP8LinearKernels | None = None) -> "DenseMLP":
        shapes, cut = mlp_shapes(prefix, width, d), even_shard(width, rank, T)
        rows = slice(cut.start, cut.stop)
        if fp8:
            src = _fp8_source(source)

            def kept(name, **part):
                return src.get_block_scaled(f"{prefix}.{name}", shapes[f"{prefix}.{name}"], **part, device=device)

            return cls(stacked_rows((kept("gate_proj.weight", rows=rows), kept("up_proj.weight", rows=rows)),
                                    dtype or torch.float32),
                       StackedFP8((kept("down_proj.weight", cols=rows),), dtype or torch.float32), silu_mul,
                       fp8_kernels)

        def get(name, **part):
            return source.get(f"{prefix}.{name}", shapes[f"{prefix}.{name}"], **part, device=device, dtype=dtype)

        return cls(torch.cat([get("gate_proj.weight", rows=rows), get("up_proj.weight", rows=rows)]),
                   get("down_proj.weight", cols=rows), silu_mul)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This shard's part of the output (to be summed over ranks)."""
        if self.kernels is not None:
            linear = self.kernels.linear
            return _by_parts(linear, self.silu_mul(_by_parts(linear, x, self.gate_up)), self.down)
        return self.silu_mul(x @ _dense(self.gate_up).t()) @ _dense(self.down).t()  # [n, 2 w]: gate then up

    def forward(self, x: torch.Tensor, collectives, host_reads: bool = True) -> torch.Tensor:
        out = self.partial(x)
        collectives.all_reduce(out)
        return out

    def nbytes(self) -> dict[str, int]:
        return {"mlp": _size(self.gate_up) + _size(self.down), "experts": 0}


class MoE:
    """This rank's part of one MoE layer: the whole router, the routed experts ``experts`` (a
    range of expert ids) stacked as ``gate_up`` [G, 2 I, d] and ``down`` [G, d, I] (tensors, or kept
    FP8), and its shard of the shared experts."""

    def __init__(self, profile: ModelProfile, router: torch.Tensor, bias: torch.Tensor | None, experts: range,
                 gate_up: torch.Tensor | StackedFP8, down: torch.Tensor | StackedFP8, shared: DenseMLP | None,
                 silu_mul=_silu_mul, fp8_kernels: FP8LinearKernels | None = None, rank: int = 0, T: int = 1,
                 shared_whole: bool = False):
        self.config = profile.moe
        self.router, self.bias, self.experts = router, bias, experts
        self.gate_up, self.down, self.shared, self.silu_mul = gate_up, down, shared, silu_mul
        self.kernels = fp8_kernels if isinstance(gate_up, StackedFP8) else None
        self.rank, self.T, self.shared_whole = rank, T, shared_whole
        self.dispatched = 0  # steps this layer dispatched by all-to-all

    @classmethod
    def load(cls, source: WeightSource, profile: ModelProfile, layer: int, rank: int, T: int,
             device=None, dtype=None, silu_mul=_silu_mul, fp8: bool = False,
             fp8_kernels: FP8LinearKernels | None = None, shared_whole: bool = False) -> "MoE":
        """``shared_whole``: the shared experts whole on this rank (for :meth:`forward_owned`), not its shard."""
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
        load_experts = _kept_experts if fp8 else _dequantized_experts
        gate_up, down = load_experts(source, f"{p}.experts", experts, width, d, device, dtype)
        shard = (0, 1) if shared_whole else (rank, T)
        shared = (DenseMLP.load(source, f"{p}.shared_experts", e.n_shared_experts * width, d, *shard, device, dtype,
                                silu_mul, fp8, fp8_kernels) if e.n_shared_experts else None)
        return cls(profile, router, bias, experts, gate_up, down, shared, silu_mul, fp8_kernels, rank, T, shared_whole)

    def _routed(self, x, weights, chosen, own: bool) -> torch.Tensor:
        """Rows ``x``'s sums over their pairs routed to the experts held here."""
        if self.kernels is not None:
            return expert_outputs(x, weights, chosen, self.experts.start, self.gate_up, self.down, self.silu_mul,
                                  own, partial(_by_parts, self.kernels.grouped))
        return expert_outputs(x, weights, chosen, self.experts.start, _dense(self.gate_up), _dense(self.down),
                              self.silu_mul, own)

    def forward(self, x: torch.Tensor, collectives, host_reads: bool = True) -> torch.Tensor:
        """The layer's output for all rows. ``host_reads``: the step may read a count back to the
        host (not in a captured graph); then, past :data:`OWN_PAIRS_FROM` routed pairs, only
        this rank's experts' pairs are built."""
        weights, chosen = route(x, self.router, self.bias, self.config)
        out = self._routed(x, weights, chosen, host_reads and chosen.numel() >= OWN_PAIRS_FROM)
        if self.shared is not None and self.shared_whole:  # each rank the shared experts of its share of rows
            rows = even_shard(x.shape[0], self.rank, self.T)
            out[rows.start: rows.stop] += self.shared.partial(x[rows.start: rows.stop])
        elif self.shared is not None:
            out = out + self.shared.partial(x)
        collectives.all_reduce(out)
        return out

    def forward_owned(self, x: torch.Tensor, collectives) -> torch.Tensor:
        """The layer's output for this rank's own rows ``x``, their pairs dispatched to the experts'
        ranks and combined by all-to-all (:mod:`~splash_core.runtime.expert_exchange`; eager steps
        only); the shared experts, held whole, computed here. A collective."""
        self.dispatched += 1
        weights, chosen = route(x, self.router, self.bias, self.config)
        per = -(-self.config.n_routed_experts // self.T)  # as even_shard places them
        out = dispatch_and_combine(collectives, self.T, x, weights, chosen, per,
                                   lambda rows, w, e: self._routed(rows, w, e, True))
        return out + self.shared.partial(x) if self.shared is not None else out

    def nbytes(self) -> dict[str, int]:
        """{'experts': the routed experts held here, 'mlp': router and shared-expert shard}."""
        shared = self.shared.nbytes()["mlp"] if self.shared is not None else 0
        return {"experts": _size(self.gate_up) + _size(self.down),
                "mlp": _size(self.router) + _size(self.bias) + shared}


def _dequantized_experts(source: WeightSource, prefix: str, experts: range, width: int, d: int, device,
                         dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [G, 2 I, d], down [G, d, I]) of ``experts`` read in the compute format ``dtype``."""
    shapes = mlp_shapes("", width, d)

    def get(j, proj):
        return source.get(f"{prefix}.{j}.{proj}.weight", shapes[f".{proj}.weight"], device=device, dtype=dtype)

    probe = get(experts.start, "down_proj") if len(experts) else torch.empty((), device=device,
                                                                               dtype=dtype or torch.float32)
    gate_up = probe.new_empty(len(experts), 2 * width, d)
    down = probe.new_empty(len(experts), d, width)
    for i, j in enumerate(experts):  # filled in place: no second copy of the experts while loading
        gate_up[i, :width] = get(j, "gate_proj")
        gate_up[i, width:] = get(j, "up_proj")
        down[i] = probe if i == 0 else get(j, "down_proj")
    return gate_up, down


def _kept_experts(source: WeightSource, prefix: str, experts: range, width: int, d: int, device,
                  dtype) -> tuple[StackedFP8, StackedFP8]:
    """(gate_up, down) of ``experts`` kept FP8 as stored, computed with in ``dtype``; each expert's gate
    and up rows joined where they meet on a block boundary (:func:`stacked_rows`: one grouped GEMM).
    Experts are read one at a time into their stacks, each tensor once."""
    src, shapes, dtype = _fp8_source(source), mlp_shapes("", width, d), dtype or torch.float32

    def get(j, proj):
        return src.get_block_scaled(f"{prefix}.{j}.{proj}.weight", shapes[f".{proj}.weight"], device=device)

    def stack(each, shape):
        return stack_experts(each, len(experts), shape, device=device)

    def pair(j):
        return stacked_rows((get(j, "gate_proj"), get(j, "up_proj")), dtype).parts

    down = StackedFP8((stack((get(j, "down_proj") for j in experts), shapes[".down_proj.weight"]),), dtype)
    first, rest = (pair(experts.start) if len(experts) else ()), experts[1:]
    if len(first) == 1:  # gate and up joined
        return StackedFP8((stack(chain(first, (pair(j)[0] for j in rest)), (2 * width, d)),), dtype), down
    gate = stack(chain(first[:1], (get(j, "gate_proj") for j in rest)), shapes[".gate_proj.weight"])
    up = stack(chain(first[1:], (get(j, "up_proj") for j in rest)), shapes[".up_proj.weight"])
    return StackedFP8((gate, up), dtype), down


def load_feed_forward(source: WeightSource, profile: ModelProfile, layer: int, rank: int, T: int,
                      device=None, dtype=None, silu_mul=None, fp8: bool = False,
                      fp8_kernels: FP8LinearKernels | None = None, shared_whole: bool = False) -> DenseMLP | MoE | None:
    """Layer ``layer``'s feed-forward part on rank ``rank`` (None: the model has none), its
    activation applied by ``silu_mul`` (None: torch's); ``fp8``: its weights kept FP8 as the
    checkpoint stores them (ValueError or CheckpointError for a source or tensor that is not),
    multiplied by ``fp8_kernels`` (None: dequantized at each use); ``shared_whole``: a MoE layer's
    shared experts whole on every rank (:meth:`MoE.forward_owned` needs them)."""
    silu_mul = silu_mul or _silu_mul
    if profile.runtime_moe_layer(layer):
        return MoE.load(source, profile, layer, rank, T, device, dtype, silu_mul, fp8, fp8_kernels, shared_whole)
    if not profile.intermediate_size:
        return None
    return DenseMLP.load(source, f"{layer_prefix(layer)}.mlp", profile.intermediate_size, profile.hidden_size,
                         rank, T, device, dtype, silu_mul, fp8, fp8_kernels)
